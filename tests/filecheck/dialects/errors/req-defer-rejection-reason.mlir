// RUN: not schedir opt %s 2>&1 | filecheck %s
// A deferral with a rejection reason.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %w = req.queue waiting {id = [3, 4], prompt = [40, 50], computed = [0, 0], total = [40, 50], max_tokens = [8, 8], priority = [1, 0], arrival = [7, 8], status = [waiting, waiting], blocks = [0, 0]}
  req.defer %w {id = [3, 4], reason = [budget, too_long]}
}

// CHECK: schedir: error: {{.*}}req-defer-rejection-reason.mlir:6:3: req.defer: request 4 has reason 'too_long', not a deferral reason (blocked, budget, in_flight, max_seqs, memory, policy)
// CHECK-NOT: Traceback
