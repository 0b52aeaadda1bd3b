// RUN: schedir opt %s -p mlfq-levels | filecheck %s --check-prefix=LEVELS
// RUN: schedir opt %s -p "reject-oversized,mlfq-levels,mlfq-order,schedule-running,admit-greedy,mlfq-account,verify-step" | filecheck %s

// FastServe's skip-join MLFQ (mlfq-levels, mlfq-order, mlfq-account), preempting by recompute
// (the fastserve preset swaps: mlfq-swap.mlir). Level i's quantum is
// 8 * 2**i iteration units; a prefill of t tokens is ceil(t / 512) units, a decode token one.
// - Request 1 runs at level 0 and has used its quantum (8 decode units since it entered the
//   level, at 4): it is demoted to level 1, and needs no new block for its next token.
// - Request 2 runs at level 2 and has not run since step 100: 400 steps without service
//   promote it to level 0.
// - Request 3 is new with a 9000-token prompt: its first iteration (18 units) skips levels 0
//   and 1 (quanta 8 and 16) and joins level 2 (quantum 32).
// - Request 4 is new with a short prompt: it joins level 0. Both seats are taken, so it takes
//   the seat of the lowest-ranked running job of a lower level: request 1 (now level 1) is
//   preempted. Request 2, promoted to level 0, ranks first.

sched.step 500 {token_budget = 16384, max_seqs = 2, block_size = 16, free_blocks = 1000, cached_free_blocks = 0, total_blocks = 2000, max_model_len = 16384, policy = "fcfs", facts = []} {
  %run = req.queue running {id = [1, 2], prompt = [8, 8], computed = [19, 29], total = [20, 30], max_tokens = [64, 64], priority = [0, 0], arrival = [100, 200], status = [running, running], blocks = [2, 2], mlfq_level = [0, 2], mlfq_prefill = [8, 8], mlfq_decode = [12, 22], mlfq_level_start = [5, 0], mlfq_last_run = [499, 100]}
  %w = req.queue waiting {id = [3, 4], prompt = [9000, 5], computed = [0, 0], total = [9000, 5], max_tokens = [8, 8], priority = [0, 0], arrival = [300, 400], status = [waiting, waiting], blocks = [0, 0]}
}

// LEVELS:      req.set_state %run {id = [1, 2], mlfq_level = [1, 0], mlfq_level_start = [13, 23], mlfq_last_run = [499, 500]}
// LEVELS-NEXT: req.set_state %w {id = [3, 4], mlfq_level = [2, 0], mlfq_level_start = [0, 0], mlfq_last_run = [500, 500]}

// CHECK:      %[[W:.*]] = req.sort %w by ["mlfq_level", "arrival"] {id = [4, 3]}
// CHECK-NEXT: %[[R:.*]] = req.sort %run by ["mlfq_level", "arrival"] {id = [2, 1]}
// CHECK-NEXT: %{{.*}} = req.preempt %[[R]] recompute {id = [1]}
// CHECK-NEXT: %[[K:.*]] = req.select %[[R]] {id = [2]}
// CHECK-NEXT: %[[D:.*]] = req.schedule %[[K]] decode {id = [2], tokens = [1]}
// CHECK:      %[[A:.*]] = req.schedule %[[W]] prefill {id = [4], tokens = [5]}
// CHECK-NEXT: mem.alloc %[[A]] {id = [4], blocks = [1]}
// CHECK-NEXT: req.defer %[[W]] {id = [3], reason = [max_seqs]}
// CHECK-NEXT: req.set_state %run {id = [2], mlfq_prefill = [8], mlfq_decode = [23], mlfq_last_run = [500]}
// CHECK-NEXT: req.set_state %w {id = [4], mlfq_prefill = [5], mlfq_decode = [0], mlfq_last_run = [500]}
// CHECK:      sched.yield %[[D]], %[[A]]
