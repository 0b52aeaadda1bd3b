// RUN: schedir opt %s -p sglang | filecheck %s

// sglang-admit is SGLang's PrefillAdder. Request 0 (40 tokens) is the chunked request: two
// 16-token chunks ran (token budget 16 = chunked_prefill_size), so it resumes first with its
// last 8; request 1 (6 tokens) fits the 8 tokens of chunk budget left. Prefill first: this
// step is the prefill batch only. Both join the running batch (sglang_join), in batch order.

builtin.module {
  sched.step 3 {token_budget = 16, max_seqs = 8, block_size = 4, free_blocks = 56, cached_free_blocks = 0, total_blocks = 64, max_model_len = 128, policy = "fcfs", facts = ["radix-pool"]} {
    mem.pool {radix = [1], blocks = [65], block_size = [4], width = [33], free = [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64], nodes = [0, 0, 1, 1, 2, -1, -1, -1, -1, -1, 0, 16, 0, 16, 16, 1, 1, 1, 5, 5, 5, 0, 1, 2], tree_tokens = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41], tree_slots = [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35], tree_meta = [0, 32, 5, 3, 32, -1, 3, 4], rows = [0, 1], row_pages = [8, 0], row_kv = [32, 0], row_protected = [32, 0], row_lock = [2, -1], row_prompt = [40, 6], row_seq = [40, 6], table = [1, 2, 3, 4, 5, 6, 7, 8], seq = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 60, 61, 62, 63, 64, 65]}
    sched.state {sglang_next_pos = 3.0, sglang_random_draws = 0.0, sglang_next_join = 0.0, new_token_ratio = 0.7, sglang_chunked = 0.0, sglang_batch_full = 0.0, sglang_batch_size = 0.0, sglang_last_ran = 1.0}
    %running = req.queue running {id = [0], prompt = [40], computed = [32], total = [40], max_tokens = [2], priority = [0], arrival = [27649416719], status = [running], blocks = [8], in_flight = [0], queued = [0], rank = [0], placeholders = [0], stale = [0], sglang_pos = [0], sglang_join = [-1]}
    %waiting = req.queue waiting {id = [1], prompt = [6], computed = [0], total = [6], max_tokens = [2], priority = [0], arrival = [27649416779], status = [waiting], blocks = [0], in_flight = [0], queued = [1], rank = [0], placeholders = [0], stale = [0], sglang_pos = [2], sglang_join = [-1]}
    sched.yield
  }
}

// CHECK:      %[[W:.*]] = req.sort %waiting by ["sglang_pos"] {id = [1]}
// CHECK-NEXT: %[[R:.*]] = req.schedule %running prefill {id = [0], tokens = [8]}
// CHECK-NEXT: mem.match %[[W]] {id = [1], hit = [0]}
// CHECK-NEXT: %[[A:.*]] = req.schedule %[[W]] prefill {id = [1], tokens = [6]}
// CHECK:      sched.set_state {sglang_next_join = 2.0, sglang_chunked = -1.0, sglang_batch_size = 2.0}
// CHECK-NOT:  decode
// CHECK:      sched.yield %[[R]], %[[A]]
