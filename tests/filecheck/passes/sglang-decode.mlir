// RUN: schedir opt %s -p "sglang-order,sglang-admit{clip=2},sglang-decode{retract-steps=2}" | filecheck %s

// sglang-decode is SGLang's update_running_batch. Three requests decode in a 16-page pool
// (4 tokens a page) with 2 pages free; their next tokens need 3 new pages, so
// retract_decode retracts the request SGLang keeps least (fewest outputs, then longest
// prompt; ties: the later one in the batch): request 1. It goes to the back of the waiting
// list. new_token_ratio becomes (18 decoded + 2 * 2) / (2 * 24 + 1) over the two that stay,
// and the batch is reordered as retract_decode leaves it (request 2 first).

builtin.module {
  sched.step 10 {token_budget = 64, max_seqs = 8, block_size = 4, free_blocks = 2, cached_free_blocks = 0, total_blocks = 16, max_model_len = 64, policy = "fcfs", facts = ["radix-pool"]} {
    mem.pool {radix = [1], blocks = [17], block_size = [4], width = [17], free = [15, 16], nodes = [0, 0, 0, 0, 3, -1, -1, -1, -1, -1, 1, 2, -1, 0, 12, 24, 0, 12, 12, 8, 1, 1, 1, 1, 9, 5, 7, 9, 0, 1, 2, 3], tree_tokens = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 50, 51, 52, 53, 54, 55, 56, 57], tree_slots = [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35], tree_meta = [0, 32, 9, 4, 32, -1, 4, 4], rows = [0, 1, 2], row_pages = [5, 5, 4], row_kv = [20, 20, 16], row_protected = [12, 12, 8], row_lock = [1, 2, 3], row_prompt = [12, 12, 8], row_seq = [21, 21, 17], table = [1, 2, 3, 9, 12, 4, 5, 6, 10, 13, 7, 8, 11, 14], seq = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 7, 7, 7, 7, 7, 7, 7, 7, 7, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 7, 7, 7, 7, 7, 7, 7, 7, 7, 50, 51, 52, 53, 54, 55, 56, 57, 7, 7, 7, 7, 7, 7, 7, 7, 7]}
    sched.state {sglang_next_pos = 3.0, sglang_random_draws = 0.0, sglang_next_join = 3.0, new_token_ratio = 0.6919733333333331, sglang_chunked = -1.0, sglang_batch_full = 0.0, sglang_batch_size = 3.0, sglang_last_ran = 1.0}
    %running = req.queue running {id = [0, 1, 2], prompt = [12, 12, 8], computed = [20, 20, 16], total = [21, 21, 17], max_tokens = [24, 24, 24], priority = [0, 0, 0], arrival = [27649318653, 27649318718, 27649318745], status = [running, running, running], blocks = [5, 5, 4], in_flight = [0, 0, 0], queued = [0, 1, 2], rank = [0, 0, 0], placeholders = [0, 0, 0], stale = [0, 0, 0], sglang_pos = [0, 1, 2], sglang_join = [0, 1, 2]}
    %waiting = req.queue waiting {id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = [], in_flight = [], queued = [], rank = [], placeholders = [], stale = [], sglang_pos = [], sglang_join = []}
    sched.yield
  }
}

// CHECK:      %[[P:.*]] = req.preempt %running recompute {id = [1]}
// CHECK-NEXT: req.set_state %running {id = [1], sglang_pos = [3]}
// CHECK-NEXT: req.set_state %running {id = [2, 0], sglang_join = [3, 4]}
// CHECK-NEXT: %[[D:.*]] = req.schedule %running decode {id = [2, 0], tokens = [1, 1]}
// CHECK-NEXT: sched.set_state {sglang_next_pos = 4.0, sglang_next_join = 5.0, new_token_ratio = 0.4489795918367347, sglang_batch_size = 2.0}
