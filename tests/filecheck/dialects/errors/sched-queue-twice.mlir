// RUN: not schedir opt %s 2>&1 | filecheck %s
// Two req.queue ops for one queue.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run = req.queue running {id = [1, 2], prompt = [10, 20], computed = [12, 21], total = [13, 22], max_tokens = [32, 32], priority = [0, 0], arrival = [5, 6], status = [running, running], blocks = [1, 2]}
  %r2 = req.queue running {id = [3], prompt = [10], computed = [12], total = [13], max_tokens = [32], priority = [0], arrival = [5], status = [running], blocks = [1]}
}

// CHECK: schedir: error: {{.*}}sched-queue-twice.mlir:4:1: sched.step: queue 'running' appears twice (one req.queue per queue)
// CHECK-NOT: Traceback
