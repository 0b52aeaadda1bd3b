// RUN: schedir opt %s -p "vllm-v0-priority" | filecheck %s

// vLLM v0 under the priority policy (v0-priority-preemption), a step that admits no prefill: the
// waiting queue's head (3, priority 0) needs 3 blocks and 1 is free, so v0-prefills stops at it.
// The running queue is sorted by (priority, arrival): 0, 1, 2. Its last request, 2 (priority 5),
// ranks below the head and the head cannot be allocated: 2 is preempted by recompute (its 2
// blocks freed) and marked as sorted into the waiting deque (v0_sorted_at = this step). Now 1
// (priority 5) is last: the head could be allocated (3 free blocks, budget and a seat left), so
// the loop stops. The pass records the sorted block's FCFS places (the head's, 0), and
// v0-running decodes 0 and 1 in the sorted order; 1 takes a block for its 9th token.

builtin.module {
  sched.step 4 {token_budget = 64, max_seqs = 4, block_size = 4, free_blocks = 1, cached_free_blocks = 0, total_blocks = 8, max_model_len = 64, now_us = 0, policy = "priority", facts = ["kv-pool", "swapped-queue"]} {
    mem.pool {blocks = [9], block_size = [4], caching = [0], width = [17], free = [8], cached = [], cached_hash = [], rows = [0, 1, 2], row_blocks = [3, 2, 2], row_cached = [0, 0, 0], row_hashes = [0, 0, 0], table = [1, 2, 3, 4, 5, 6, 7], hash = [], host_blocks = [4], host_free = [3, 2, 1, 0], host_rows = [], host_row_blocks = [], host_table = []}
    sched.state {v0_sort_step = -1.0, v0_sort_lo = 0.0, v0_sort_hi = -1.0, v0_prev_time_us = 0.0, v0_prev_prompt = 0.0, v0_last_prompt_latency_us = 0.0}
    %running = req.queue running {id = [2, 0, 1], prompt = [6, 6, 6], computed = [7, 10, 8], total = [8, 11, 9], max_tokens = [12, 12, 12], priority = [5, 0, 5], arrival = [20, 0, 10], status = [running, running, running], blocks = [2, 3, 2], in_flight = [0, 0, 0], queued = [0, 0, 0], rank = [0, 0, 0], placeholders = [0, 0, 0], stale = [0, 0, 0], v0_sorted_at = [-1, -1, -1]}
    %waiting = req.queue waiting {id = [3], prompt = [12], computed = [0], total = [12], max_tokens = [4], priority = [0], arrival = [30], status = [waiting], blocks = [0], in_flight = [0], queued = [0], rank = [0], placeholders = [0], stale = [0], v0_sorted_at = [-1]}
    %swapped = req.queue swapped {id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = [], in_flight = [], queued = [], rank = [], placeholders = [], stale = [], v0_sorted_at = []}
    sched.yield
  }
}

// CHECK:      %[[W:.*]] = req.sort %waiting by ["v0_deque_run", "priority", "arrival", "queued"] {id = [3]}
// CHECK:      req.defer %[[W]] {id = [3], reason = [memory]}
// CHECK-NEXT: %[[R:.*]] = req.sort %running by ["priority", "arrival"] {id = [0, 1, 2]}
// CHECK-NEXT: %[[P:.*]] = req.preempt %[[R]] recompute {id = [2]}
// CHECK-NEXT: mem.free %[[P]] {id = [2], blocks = [2]}
// CHECK-NEXT: %[[K:.*]] = req.select %[[R]] {id = [0, 1]}
// CHECK-NEXT: sched.set_state {v0_sort_step = 4.0, v0_sort_lo = 0.0, v0_sort_hi = 0.0}
// CHECK-NEXT: req.set_state %[[R]] {id = [2], v0_sorted_at = [4]}
// CHECK-NEXT: %[[D:.*]] = req.schedule %[[K]] decode {id = [0, 1], tokens = [1, 1]}
// CHECK-NEXT: mem.alloc %[[D]] {id = [1], blocks = [1]}
// CHECK-NOT:  req.preempt
// CHECK:      sched.yield %[[D]]
