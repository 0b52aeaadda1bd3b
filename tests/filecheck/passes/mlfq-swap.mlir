// RUN: schedir opt %s -p fastserve | filecheck %s

// FastServe's swap (mlfq-order{preemption=swap}, mlfq-swap-in), two steps.
// Step 500: two seats, both taken. Request 4 is new with a short prompt: level 0. The
// candidates for a seat, swapped and waiting together in (level, arrival) order, are 4 (level
// 0) then 5 (swapped, level 1). Request 4 takes the seat of the lowest-ranked running job of a
// lower level, request 1 (level 2): its 3 blocks fit the host tier's 10 free, so it is swapped
// out, not recomputed. Request 5 finds only request 2 (level 0) ahead: it stays swapped
// (max_seqs: request 4 ranks ahead of it for the freed seat), and admission takes request 4.
// Step 501: a free seat. Request 5 (level 1) ranks ahead of the new 9000-token request 6
// (skip-join: level 2): its 2 host blocks are copied back (mem.swap_in) and it decodes on;
// its next token fits those blocks. Request 6 is then admitted.

builtin.module {
  sched.step 500 {token_budget = 16384, max_seqs = 2, block_size = 16, free_blocks = 1000, cached_free_blocks = 0, total_blocks = 2000, max_model_len = 16384, host_free_blocks = 10, policy = "fcfs", facts = ["swapped-queue"]} {
    %run = req.queue running {id = [1, 2], prompt = [8, 8], computed = [40, 10], total = [41, 11], max_tokens = [64, 64], priority = [0, 0], arrival = [100, 200], status = [running, running], blocks = [3, 1], in_flight = [0, 0], mlfq_level = [2, 0], mlfq_prefill = [8, 8], mlfq_decode = [32, 3], mlfq_level_start = [24, 0], mlfq_last_run = [499, 499]}
    %w = req.queue waiting {id = [4], prompt = [5], computed = [0], total = [5], max_tokens = [8], priority = [0], arrival = [400], status = [waiting], blocks = [0], in_flight = [0]}
    %sw = req.queue swapped {id = [5], prompt = [8], computed = [20], total = [21], max_tokens = [64], priority = [0], arrival = [300], status = [swapped], blocks = [2], in_flight = [0], mlfq_level = [1], mlfq_prefill = [8], mlfq_decode = [12], mlfq_level_start = [9], mlfq_last_run = [490]}
  }
  sched.step 501 {token_budget = 16384, max_seqs = 3, block_size = 16, free_blocks = 1000, cached_free_blocks = 0, total_blocks = 2000, max_model_len = 16384, host_free_blocks = 8, policy = "fcfs", facts = ["swapped-queue"]} {
    %run = req.queue running {id = [2], prompt = [8], computed = [10], total = [11], max_tokens = [64], priority = [0], arrival = [200], status = [running], blocks = [1], in_flight = [0], mlfq_level = [0], mlfq_prefill = [8], mlfq_decode = [3], mlfq_level_start = [0], mlfq_last_run = [500]}
    %w = req.queue waiting {id = [6], prompt = [9000], computed = [0], total = [9000], max_tokens = [8], priority = [0], arrival = [600], status = [waiting], blocks = [0], in_flight = [0]}
    %sw = req.queue swapped {id = [5], prompt = [8], computed = [20], total = [21], max_tokens = [64], priority = [0], arrival = [300], status = [swapped], blocks = [2], in_flight = [0], mlfq_level = [1], mlfq_prefill = [8], mlfq_decode = [12], mlfq_level_start = [9], mlfq_last_run = [490]}
  }
}

// CHECK:      sched.step 500 {{.*}}host_free_blocks = 10
// CHECK:      %[[W:.*]] = req.sort %w by ["mlfq_level", "arrival"] {id = [4]}
// CHECK-NEXT: %[[S:.*]] = req.sort %sw by ["mlfq_level", "arrival"] {id = [5]}
// CHECK-NEXT: %[[R:.*]] = req.sort %run by ["mlfq_level", "arrival"] {id = [2, 1]}
// CHECK-NEXT: %{{.*}} = req.preempt %[[R]] swap {id = [1]}
// CHECK-NEXT: %[[K:.*]] = req.select %[[R]] {id = [2]}
// CHECK-NEXT: %[[D:.*]] = req.schedule %[[K]] decode {id = [2], tokens = [1]}
// CHECK-NEXT: req.defer %[[S]] {id = [5], reason = [max_seqs]}
// CHECK-NEXT: %[[A:.*]] = req.schedule %[[W]] prefill {id = [4], tokens = [5]}
// CHECK-NEXT: mem.alloc %[[A]] {id = [4], blocks = [1]}
// CHECK:      sched.yield %[[D]], %[[A]]

// CHECK:      sched.step 501
// CHECK:      %[[W2:.*]] = req.sort %w_1 by ["mlfq_level", "arrival"] {id = [6]}
// CHECK-NEXT: %[[S2:.*]] = req.sort %sw_1 by ["mlfq_level", "arrival"] {id = [5]}
// CHECK-NEXT: %[[R2:.*]] = req.sort %run_1 by ["mlfq_level", "arrival"] {id = [2]}
// CHECK-NEXT: %[[D2:.*]] = req.schedule %[[R2]] decode {id = [2], tokens = [1]}
// CHECK-NEXT: %[[B2:.*]] = req.schedule %[[S2]] decode {id = [5], tokens = [1]}
// CHECK-NEXT: mem.swap_in %[[B2]] {id = [5], blocks = [2]}
// CHECK-NEXT: %[[A2:.*]] = req.schedule %[[W2]] prefill {id = [6], tokens = [9000]}
// CHECK-NEXT: mem.alloc %[[A2]] {id = [6], blocks = [563]}
// CHECK:      req.set_state %sw_1 {id = [5], mlfq_prefill = [8], mlfq_decode = [13], mlfq_last_run = [501]}
// CHECK:      sched.yield %[[D2]], %[[B2]], %[[A2]]
