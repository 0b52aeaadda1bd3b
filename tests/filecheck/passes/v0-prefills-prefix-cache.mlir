// RUN: schedir opt %s -p "order-vllm,v0-prefills,v0-running,v0-swapped" | filecheck %s

// vLLM v0's prompt step with its prefix-caching allocator (`caching = [2]`: vllm-v0 with prefix
// caching on). Block size 4. Request 0's prompt starts with 8 tokens whose two blocks (1, 2)
// sit in v0's evictor, registered at step 1 (v0_blocks: last access, depth, registration step
// per block), so they are computed: it is charged 2 uncached tokens of 10 and starts past 8
// cached ones (`mem.match`), taking blocks 1 and 2 back out of the free queue. Requests 1 and 2
// share a new 8-token prefix: request 1 registers its two full blocks as it is allocated (4, 5);
// request 2 takes those same blocks, but they were registered in this step, not computed, so v0
// charges it all 9 tokens (hit 0), as it does request 1. Nine blocks stay free: 16 - 3 - 3 - 1.
// The hits v0 noted for the three stay with the pool (`v0_noted`) while they are prefilling.

builtin.module {
  sched.step 3 {token_budget = 32, max_seqs = 4, block_size = 4, free_blocks = 16, cached_free_blocks = 2, total_blocks = 16, max_model_len = 32, now_us = 0, policy = "fcfs", facts = ["kv-pool", "swapped-queue"]} {
    mem.pool {blocks = [17], block_size = [4], caching = [2], width = [9], free = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 2, 1], cached = [1, 2], cached_hash = [8155681202397627017, -7819310085225234111], rows = [0, 1, 2], row_blocks = [0, 0, 0], row_cached = [0, 0, 0], row_hashes = [2, 2, 2], table = [], hash = [8155681202397627017, -7819310085225234111, 6218136149747863692, 3623141199127825726, 6218136149747863692, 3623141199127825726], v0_clock = [3, 2], v0_blocks = [0, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], v0_noted = [-1, -1, -1], v0_access = [0, 0, 0]}
    sched.state {v0_prev_time_us = 0.0, v0_prev_prompt = 0.0, v0_last_prompt_latency_us = 0.0}
    %running = req.queue running {id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = [], in_flight = [], queued = [], rank = [], placeholders = [], stale = []}
    %waiting = req.queue waiting {id = [0, 1, 2], prompt = [10, 9, 9], computed = [0, 0, 0], total = [10, 9, 9], max_tokens = [2, 2, 2], priority = [0, 0, 0], arrival = [0, 0, 0], status = [waiting, waiting, waiting], blocks = [0, 0, 0], in_flight = [0, 0, 0], queued = [1, 2, 3], rank = [0, 0, 0], placeholders = [0, 0, 0], stale = [0, 0, 0]}
    %swapped = req.queue swapped {id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = [], in_flight = [], queued = [], rank = [], placeholders = [], stale = []}
    sched.yield
  }
}

// CHECK:      mem.pool {blocks = [17], block_size = [4], caching = [2], width = [9], free = [8, 9, 10, 11, 12, 13, 14, 15, 16], cached = [1, 2, 4, 5],
// CHECK-SAME: table = [1, 2, 3, 4, 5, 6, 4, 5, 7]
// CHECK-SAME: v0_noted = [8, 0, 0]
// CHECK:      mem.match %{{.*}} {id = [0, 1, 2], hit = [8, 0, 0]}
// CHECK:      req.schedule %{{.*}} prefill {id = [0, 1, 2], tokens = [2, 9, 9]}
// CHECK-NEXT: mem.alloc %{{.*}} {id = [0, 1, 2], blocks = [3, 3, 3]}
// CHECK-NOT:  req.schedule %running
