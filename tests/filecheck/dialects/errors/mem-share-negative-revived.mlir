// RUN: not schedir opt %s 2>&1 | filecheck %s
// A negative revived count.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %w = req.queue waiting {id = [3, 4], prompt = [40, 50], computed = [0, 0], total = [40, 50], max_tokens = [8, 8], priority = [1, 0], arrival = [7, 8], status = [waiting, waiting], blocks = [0, 0]}
  %a = req.schedule %w prefill {id = [3], tokens = [24]}
  mem.share %a {id = [3], blocks = [1], revived = [-1]}
}

// CHECK: schedir: error: {{.*}}mem-share-negative-revived.mlir:7:3: mem.share: column 'revived' is negative for request(s) [3]
// CHECK-NOT: Traceback
