// RUN: schedir opt %s -p vllm-schedule-running | filecheck %s

// Async scheduling (vLLM's AsyncScheduler): both running requests have a step in
// flight whose sampled token is still a placeholder (`placeholders = [1, 1]`), so
// `computed` already counts its position and `total` does not. Request 0 asks for
// total + placeholders - computed = 1 token and goes ahead (its position 8 starts a
// new block of 4). Request 1 (6 prompt tokens, max_tokens 3) sits out: the step in
// flight samples its last token, since computed + 2 - placeholders = 9 >= 6 + 3.

builtin.module {
  sched.step 4 {token_budget = 16, max_seqs = 256, block_size = 4, free_blocks = 11, cached_free_blocks = 0, total_blocks = 15, max_model_len = 64, policy = "fcfs", facts = ["kv-pool"]} {
    mem.pool {blocks = [16], block_size = [4], caching = [0], width = [17], free = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], cached = [], cached_hash = [], rows = [0, 1], row_blocks = [2, 2], row_cached = [0, 0], row_hashes = [0, 0], table = [1, 2, 3, 4], hash = []}
    %running = req.queue running {id = [0, 1], prompt = [6, 6], computed = [8, 8], total = [8, 8], max_tokens = [12, 3], priority = [0, 0], arrival = [0, 10], status = [running, running], blocks = [2, 2], in_flight = [1, 1], queued = [0, 1], rank = [0, 0], placeholders = [1, 1], stale = [0, 0]}
    sched.yield
  }
}

// CHECK:      mem.pool {{.*}} row_blocks = [3, 2]
// CHECK:      %[[SCHED:.*]] = req.schedule %running mixed {id = [0], tokens = [1]}
// CHECK-NEXT: mem.alloc %[[SCHED]] {id = [0], blocks = [1]}
// CHECK-NEXT: req.defer %running {id = [1], reason = [in_flight]}
// CHECK-NEXT: sched.yield %[[SCHED]]
