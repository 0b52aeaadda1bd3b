// RUN: schedir opt %s -p "order-vllm,v0-prefills,v0-running{preemption=swap},v0-swapped" | filecheck %s

// vLLM v0's decode step (v0-running): three requests decode one token each in an 8-block pool
// with 2 blocks free. Requests 0 and 1 each fill their second block and take a new one; then no
// block is free, and v0's can_append_slots wants one for request 2 (it assumes every decode
// touches a new block), so the last running request not yet scheduled, 2 itself, is preempted:
// by swap, its 2 blocks copied to host blocks. A step that preempted swaps nobody in (v0-swapped).

builtin.module {
  sched.step 4 {token_budget = 64, max_seqs = 4, block_size = 4, free_blocks = 2, cached_free_blocks = 0, total_blocks = 8, max_model_len = 64, now_us = 0, policy = "fcfs", facts = ["kv-pool", "swapped-queue"]} {
    mem.pool {blocks = [9], block_size = [4], caching = [0], width = [17], free = [7, 8], cached = [], cached_hash = [], rows = [0, 1, 2], row_blocks = [2, 2, 2], row_cached = [0, 0, 0], row_hashes = [0, 0, 0], table = [1, 2, 3, 4, 5, 6], hash = [], host_blocks = [8], host_free = [7, 6, 5, 4, 3, 2, 1, 0], host_rows = [], host_row_blocks = [], host_table = []}
    sched.state {v0_prev_time_us = 0.0, v0_prev_prompt = 0.0, v0_last_prompt_latency_us = 0.0}
    %running = req.queue running {id = [0, 1, 2], prompt = [6, 6, 6], computed = [8, 8, 8], total = [9, 9, 9], max_tokens = [12, 12, 12], priority = [0, 0, 0], arrival = [0, 0, 0], status = [running, running, running], blocks = [2, 2, 2], in_flight = [0, 0, 0], queued = [0, 1, 2], rank = [0, 0, 0], placeholders = [0, 0, 0], stale = [0, 0, 0]}
    %waiting = req.queue waiting {id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = [], in_flight = [], queued = [], rank = [], placeholders = [], stale = []}
    %swapped = req.queue swapped {id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = [], in_flight = [], queued = [], rank = [], placeholders = [], stale = []}
    sched.yield
  }
}

// CHECK:      %[[D:.*]] = req.schedule %running decode {id = [0, 1], tokens = [1, 1]}
// CHECK-NEXT: mem.alloc %[[D]] {id = [0, 1], blocks = [1, 1]}
// CHECK-NEXT: %[[P:.*]] = req.preempt %running swap {id = [2]}
// CHECK-NEXT: mem.swap_out %[[P]] {id = [2], blocks = [2]}
// CHECK-NOT:  mem.swap_in
// CHECK:      sched.yield %[[D]]
