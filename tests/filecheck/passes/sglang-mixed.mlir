// RUN: schedir opt %s -p sglang-mixed | filecheck %s
// RUN: schedir opt %s -p sglang | filecheck %s --check-prefix=FIRST

// Mixed chunked prefill (SGLang's --enable-mixed-chunk, sglang-admit{mixed=1}): request 0
// decodes while request 1 (20 tokens) prefills. The adder sets one token aside per running
// request (num_mixed_decode_tokens), so the chunk is 16 - 1 = 15 tokens, cut to whole 4-token
// pages: 12; request 0 decodes in the same step. Without it, prefill first: request 1 takes
// all 16 tokens and request 0 waits.

builtin.module {
  sched.step 2 {token_budget = 16, max_seqs = 8, block_size = 4, free_blocks = 61, cached_free_blocks = 0, total_blocks = 64, max_model_len = 128, policy = "fcfs", facts = ["radix-pool"]} {
    mem.pool {radix = [1], blocks = [65], block_size = [4], width = [33], free = [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64], nodes = [0, 0, 1, -1, -1, -1, -1, 0, 0, 8, 1, 1, 4, 4, 0, 1], tree_tokens = [10, 11, 12, 13, 14, 15, 16, 17], tree_slots = [4, 5, 6, 7, 8, 9, 10, 11], tree_meta = [0, 8, 4, 2, 8, -1, 2, 4], rows = [0, 1], row_pages = [3, 0], row_kv = [10, 0], row_protected = [8, 0], row_lock = [1, -1], row_prompt = [10, 20], row_seq = [11, 20], table = [1, 2, 3], seq = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 7, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49]}
    sched.state {sglang_next_pos = 1.0, sglang_random_draws = 0.0, sglang_refresh_calls = 1.0, sglang_next_join = 1.0, new_token_ratio = 0.7, sglang_chunked = -1.0, sglang_batch_full = 0.0, sglang_batch_size = 1.0, sglang_last_ran = 1.0}
    %running = req.queue running {id = [0], prompt = [10], computed = [10], total = [11], max_tokens = [6], priority = [0], arrival = [31213158839], status = [running], blocks = [3], in_flight = [0], queued = [0], rank = [0], placeholders = [0], stale = [0], sglang_pos = [0], sglang_join = [0]}
    %waiting = req.queue waiting {id = [1], prompt = [20], computed = [0], total = [20], max_tokens = [4], priority = [0], arrival = [31213581273], status = [waiting], blocks = [0], in_flight = [0], queued = [1], rank = [0], placeholders = [0], stale = [0], sglang_pos = [-1], sglang_join = [-1]}
    sched.yield
  }
}

// CHECK:      req.schedule %{{.*}} prefill {id = [1], tokens = [12]}
// CHECK-NEXT: req.schedule %running decode {id = [0], tokens = [1]}

// FIRST:      req.schedule %{{.*}} prefill {id = [1], tokens = [16]}
// FIRST-NOT:  decode
