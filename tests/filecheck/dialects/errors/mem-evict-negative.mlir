// RUN: not schedir opt %s 2>&1 | filecheck %s
// A negative eviction count.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  mem.evict -2
}

// CHECK: schedir: error: {{.*}}mem-evict-negative.mlir:5:3: mem.evict: block count -2 is negative
// CHECK-NOT: Traceback
