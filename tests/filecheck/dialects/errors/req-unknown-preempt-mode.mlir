// RUN: not schedir opt %s 2>&1 | filecheck %s
// An unknown preemption mode (a parse error).

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run = req.queue running {id = [1, 2], prompt = [10, 20], computed = [12, 21], total = [13, 22], max_tokens = [32, 32], priority = [0, 0], arrival = [5, 6], status = [running, running], blocks = [1, 2]}
  %p = req.preempt %run evict {id = [1]}
}

// CHECK: schedir: error: {{.*}}req-unknown-preempt-mode.mlir:6:25
// CHECK: (recompute or swap)
// CHECK-NOT: Traceback
