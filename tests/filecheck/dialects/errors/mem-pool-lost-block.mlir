// RUN: not schedir opt %s 2>&1 | filecheck %s
// A printed pool must account for every block: block 4 is neither free nor in a table.

builtin.module {
  sched.step 1 {token_budget = 16, max_seqs = 8, block_size = 4, free_blocks = 3, cached_free_blocks = 0, total_blocks = 7, max_model_len = 64, policy = "fcfs", facts = ["kv-pool"]} {
    mem.pool {blocks = [8], block_size = [4], caching = [1], width = [4], free = [5, 6, 7], cached = [], cached_hash = [], rows = [0], row_blocks = [3], row_cached = [0], row_hashes = [0], table = [1, 2, 3], hash = []}
    sched.yield
  }
}

// CHECK: mem-pool-lost-block.mlir:{{[0-9]+}}:{{[0-9]+}}: {{.*}}mem.pool: blocks are lost (neither held nor free)
