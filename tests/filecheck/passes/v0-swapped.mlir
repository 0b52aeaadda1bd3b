// RUN: schedir opt %s -p "order-vllm,v0-prefills,v0-running{preemption=swap},v0-swapped" | filecheck %s

// vLLM v0's swap-in (v0-swapped): request 0 decodes; requests 2 and 1 wait on the host tier, in
// swap-out order. Request 2 (8 tokens of KV: 2 full blocks, plus the one block its next token
// touches: 3) fits the 4 free blocks: its 2 host blocks come back (mem.swap_in) and its decode
// takes a third. Request 1 then needs 13 // 4 + 1 = 4 blocks with 1 free: it waits (memory).

builtin.module {
  sched.step 10 {token_budget = 64, max_seqs = 4, block_size = 4, free_blocks = 4, cached_free_blocks = 0, total_blocks = 8, max_model_len = 64, now_us = 0, policy = "fcfs", facts = ["kv-pool", "swapped-queue"]} {
    mem.pool {blocks = [9], block_size = [4], caching = [0], width = [17], free = [5, 8, 4, 3], cached = [], cached_hash = [], rows = [0], row_blocks = [4], row_cached = [0], row_hashes = [0], table = [1, 2, 7, 6], hash = [], host_blocks = [8], host_free = [7, 6], host_rows = [1, 2], host_row_blocks = [4, 2], host_table = [2, 3, 4, 5, 0, 1]}
    sched.state {v0_prev_time_us = 0.0, v0_prev_prompt = 0.0, v0_last_prompt_latency_us = 0.0}
    %running = req.queue running {id = [0], prompt = [6], computed = [14], total = [15], max_tokens = [12], priority = [0], arrival = [0], status = [running], blocks = [4], in_flight = [0], queued = [0], rank = [0], placeholders = [0], stale = [0]}
    %waiting = req.queue waiting {id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = [], in_flight = [], queued = [], rank = [], placeholders = [], stale = []}
    %swapped = req.queue swapped {id = [2, 1], prompt = [6, 6], computed = [8, 13], total = [9, 14], max_tokens = [12, 12], priority = [0, 0], arrival = [0, 0], status = [swapped, swapped], blocks = [0, 0], in_flight = [0, 0], queued = [2, 1], rank = [0, 0], placeholders = [0, 0], stale = [0, 0]}
    sched.yield
  }
}

// CHECK:      %[[D:.*]] = req.schedule %running decode {id = [0], tokens = [1]}
// CHECK-NEXT: %[[S:.*]] = req.schedule %swapped decode {id = [2], tokens = [1]}
// CHECK-NEXT: mem.swap_in %[[S]] {id = [2], blocks = [2]}
// CHECK-NEXT: mem.alloc %[[S]] {id = [2], blocks = [1]}
// CHECK-NEXT: req.defer %swapped {id = [1], reason = [memory]}
