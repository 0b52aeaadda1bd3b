// RUN: not schedir opt %s 2>&1 | filecheck %s
// A step fact that does not exist.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024, kv_dtype = 8} {
}

// CHECK: schedir: error: {{.*}}sched-unknown-fact.mlir:4:{{(148|157)}}
// CHECK: unknown step fact 'kv_dtype' (expected: token_budget, max_seqs, block_size, free_blocks, cached_free_blocks, total_blocks, max_model_len, policy, facts, now_us, host_free_blocks, waiting_count)
// CHECK-NOT: Traceback
