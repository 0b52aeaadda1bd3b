// RUN: not schedir opt %s 2>&1 | filecheck %s
// Blocks freed for a request outside the operand set.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run = req.queue running {id = [1, 2], prompt = [10, 20], computed = [12, 21], total = [13, 22], max_tokens = [32, 32], priority = [0, 0], arrival = [5, 6], status = [running, running], blocks = [1, 2]}
  %p = req.preempt %run recompute {id = [1]}
  mem.free %p {id = [2], blocks = [2]}
}

// CHECK: schedir: error: {{.*}}mem-free-not-in-operand.mlir:7:3: mem.free: request(s) [2] are not in the operand set
// CHECK-NOT: Traceback
