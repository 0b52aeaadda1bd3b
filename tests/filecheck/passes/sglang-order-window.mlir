// RUN: schedir opt %s -p sglang-order | filecheck %s

// sglang-order's step over a window of SGLang's list: `waiting_count = 200` says 200 requests
// wait though the step holds three (the runtime left the rest out), so `lpm` is FCFS here, as
// SGLang's `_determine_active_policy` makes it above 128 waiting: no prefix match, the list's
// order kept, and only the new arrivals take places at its end. (sglang-order.mlir: the same
// three requests, the whole list, ordered by prefix.)

builtin.module {
  sched.step 3 {token_budget = 256, max_seqs = 8, block_size = 4, free_blocks = 64, cached_free_blocks = 7, total_blocks = 64, max_model_len = 128, waiting_count = 200, policy = "lpm", facts = ["radix-pool"]} {
    mem.pool {radix = [1], blocks = [65], block_size = [4], width = [33], free = [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64], nodes = [0, 0, 1, -1, -1, -1, -1, 0, 0, 28, 1, 0, 4, 4, 0, 1], tree_tokens = [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 1, 2, 3, 4], tree_slots = [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31], tree_meta = [28, 0, 4, 2, 28, -1, 2, 4], rows = [0, 1, 2], row_pages = [0, 0, 0], row_kv = [0, 0, 0], row_protected = [0, 0, 0], row_lock = [-1, -1, -1], row_prompt = [44, 28, 44], row_seq = [44, 28, 44], table = [], seq = [300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311, 312, 313, 314, 315, 316, 317, 318, 319, 320, 321, 322, 323, 324, 325, 326, 327, 328, 329, 330, 331, 332, 333, 334, 335, 336, 337, 338, 339, 5, 5, 5, 5, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 9, 9, 9, 9, 300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311, 312, 313, 314, 315, 316, 317, 318, 319, 320, 321, 322, 323, 324, 325, 326, 327, 328, 329, 330, 331, 332, 333, 334, 335, 336, 337, 338, 339, 6, 6, 6, 6]}
    sched.state {sglang_next_pos = 1.0, sglang_random_draws = 0.0, sglang_next_join = 1.0, new_token_ratio = 0.7, sglang_chunked = -1.0, sglang_batch_full = 0.0, sglang_batch_size = 0.0, sglang_last_ran = 0.0}
    %running = req.queue running {id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = [], in_flight = [], queued = [], rank = [], placeholders = [], stale = [], sglang_pos = [], sglang_join = []}
    %waiting = req.queue waiting {id = [0, 1, 2], prompt = [44, 28, 44], computed = [0, 0, 0], total = [44, 28, 44], max_tokens = [4, 4, 4], priority = [0, 0, 0], arrival = [27649301768, 27649301842, 27649301875], status = [waiting, waiting, waiting], blocks = [0, 0, 0], in_flight = [0, 0, 0], queued = [1, 2, 3], rank = [0, 0, 0], placeholders = [0, 0, 0], stale = [0, 0, 0], sglang_pos = [-1, -1, -1], sglang_join = [-1, -1, -1]}
    sched.yield
  }
}

// CHECK-NOT:  mem.match
// CHECK:      sched.set_state {sglang_refresh_calls = 1.0, sglang_next_pos = 4.0}
// CHECK-NEXT: req.set_state %waiting {id = [0, 1, 2], sglang_pos = [1, 2, 3]}
// CHECK-NEXT: req.sort %waiting by ["sglang_pos"] {id = [0, 1, 2]}
