// RUN: schedir opt %s -p vllm-schedule-running | filecheck %s
// RUN: schedir opt %s -p vllm-schedule-running --generic | schedir opt - | filecheck %s

// vllm-schedule-running is vLLM 0.32's RUNNING loop over the step's KV pool
// (mem.pool). Request 0 needs no new block for its next token; request 1
// takes the last free block (8); request 2 then finds no free block, is the
// last running request and so its own victim: it is preempted by recompute,
// its blocks freed tail first (6, then 5; both hashed, so they go to the back
// of the free queue and stay prefix-cache hits).

builtin.module {
  sched.step 5 {token_budget = 16, max_seqs = 256, block_size = 4, free_blocks = 1, cached_free_blocks = 0, total_blocks = 8, max_model_len = 64, policy = "fcfs", facts = ["kv-pool"]} {
    mem.pool {blocks = [9], block_size = [4], caching = [1], width = [17], free = [8], cached = [1, 3, 5, 2, 4, 6], cached_hash = [4812885095571011673, 2380931400704237195, 4640950796963231581, -1220261546962808545, -5388812572671360070, -2964880379226306671], rows = [0, 1, 2], row_blocks = [3, 2, 2], row_cached = [2, 2, 2], row_hashes = [2, 2, 2], table = [1, 2, 7, 3, 4, 5, 6], hash = [4812885095571011673, -1220261546962808545, 2380931400704237195, -5388812572671360070, 4640950796963231581, -2964880379226306671]}
    %running = req.queue running {id = [0, 1, 2], prompt = [6, 5, 6], computed = [9, 8, 8], total = [10, 9, 9], max_tokens = [12, 12, 12], priority = [0, 0, 0], arrival = [0, 0, 1000000], status = [running, running, running], blocks = [3, 2, 2], in_flight = [0, 0, 0], queued = [0, 1, 2], rank = [0, 0, 0]}
    %waiting = req.queue waiting {id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = [], in_flight = [], queued = [], rank = []}
    sched.yield
  }
}

// CHECK:      mem.pool {{.*}} free = [6, 5]
// CHECK-SAME: row_blocks = [3, 3, 0]
// CHECK:      %[[SCHED:.*]] = req.schedule %running mixed {id = [0, 1], tokens = [1, 1]}
// CHECK-NEXT: mem.alloc %[[SCHED]] {id = [1], blocks = [1]}
// CHECK-NEXT: %[[GONE:.*]] = req.preempt %running recompute {id = [2]}
// CHECK-NEXT: mem.free %[[GONE]] {id = [2], blocks = [2]}
// CHECK-NEXT: sched.yield %[[SCHED]]
