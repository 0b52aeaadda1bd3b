// RUN: schedir opt %s | schedir opt - | filecheck %s
// RUN: schedir opt %s --generic | schedir opt - | filecheck %s

// mem.pool carries the KV pool of a step: the free queue front to back, the
// registered (prefix-cache) blocks with their hashes, and per request row its
// block table and chained block hashes. Reference counts follow from the tables.

builtin.module {
  sched.step 1 {token_budget = 16, max_seqs = 8, block_size = 4, free_blocks = 5, cached_free_blocks = 1, total_blocks = 7, max_model_len = 64, policy = "fcfs", facts = ["kv-pool"]} {
    mem.pool {blocks = [8], block_size = [4], caching = [1], width = [4], free = [4, 5, 6, 7, 3], cached = [1, 3], cached_hash = [11, 12], rows = [0], row_blocks = [2], row_cached = [1], row_hashes = [2], table = [1, 2], hash = [11, 13]}
    sched.yield
  }
}

// CHECK: mem.pool {blocks = [8], block_size = [4], caching = [1], width = [4], free = [4, 5, 6, 7, 3], cached = [1, 3], cached_hash = [11, 12], rows = [0], row_blocks = [2], row_cached = [1], row_hashes = [2], table = [1, 2], hash = [11, 13]}
