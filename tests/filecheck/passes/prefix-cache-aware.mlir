// RUN: schedir opt %s -p prefix-cache-aware | filecheck %s
// RUN: schedir opt %s -p "prefix-cache-aware{min_blocks=3}" | filecheck %s --check-prefix=MIN3

// prefix-cache-aware orders the waiting set by the step's prefix-cache hit (mem.match `hit`,
// tokens), longest first; equal hits (requests sharing a prefix) stay together, by arrival.
//   id       10  11  12  13  14
//   hit       0  32  64  32   0
//   arrival   1   2   3   4   0
// -> 12 (64); 11, 13 (32, by arrival); 14, 10 (no hit, by arrival).
// With min_blocks=3 (48 tokens at block_size 16) only 12's hit counts.
sched.step 1 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 20, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1000, policy = "fcfs", facts = []} {
  %w1 = req.queue waiting {id = [10, 11, 12, 13, 14], prompt = [80, 80, 80, 80, 80], computed = [0, 0, 0, 0, 0], total = [80, 80, 80, 80, 80], max_tokens = [8, 8, 8, 8, 8], priority = [0, 0, 0, 0, 0], arrival = [1, 2, 3, 4, 0], status = [waiting, waiting, waiting, waiting, waiting], blocks = [0, 0, 0, 0, 0]}
  mem.match %w1 {id = [10, 11, 12, 13, 14], hit = [0, 32, 64, 32, 0], cached_free = [0, 0, 0, 0, 0]}
}

// CHECK-LABEL:  sched.step 1
// CHECK-SAME:     facts = ["order"]
// CHECK:          req.sort %w1 by ["prefix_hit desc", "arrival"] {id = [12, 11, 13, 14, 10]}
// CHECK-NEXT:     sched.yield

// MIN3:           req.sort %w1 by ["prefix_hit desc", "arrival"] {id = [12, 14, 10, 11, 13]}
