// RUN: not schedir opt %s 2>&1 | filecheck %s
// A decision on requests that are not in its operand set.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run = req.queue running {id = [1, 2], prompt = [10, 20], computed = [12, 21], total = [13, 22], max_tokens = [32, 32], priority = [0, 0], arrival = [5, 6], status = [running, running], blocks = [1, 2]}
  %w = req.queue waiting {id = [3, 4], prompt = [40, 50], computed = [0, 0], total = [40, 50], max_tokens = [8, 8], priority = [1, 0], arrival = [7, 8], status = [waiting, waiting], blocks = [0, 0]}
  req.defer %w {id = [3, 1, 9], reason = [budget, budget, memory]}
}

// CHECK: schedir: error: {{.*}}req-ids-not-in-operand.mlir:7:3: req.defer: request(s) [1, 9] are not in the operand set
// CHECK-NOT: Traceback
