// RUN: not schedir opt %s 2>&1 | filecheck %s
// One request id in two queues.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run = req.queue running {id = [1, 2], prompt = [10, 20], computed = [12, 21], total = [13, 22], max_tokens = [32, 32], priority = [0, 0], arrival = [5, 6], status = [running, running], blocks = [1, 2]}
  %w = req.queue waiting {id = [2], prompt = [10], computed = [0], total = [10], max_tokens = [32], priority = [0], arrival = [5], status = [waiting], blocks = [0]}
}

// CHECK: schedir: error: {{.*}}sched-id-in-two-queues.mlir:4:1: sched.step: request(s) [2] are in more than one queue
// CHECK-NOT: Traceback
