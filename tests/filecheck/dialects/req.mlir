// RUN: schedir opt %s | schedir opt - | filecheck %s
// RUN: schedir opt %s --generic | schedir opt - | filecheck %s
// RUN: schedir opt %s --generic | filecheck %s --check-prefix=GENERIC

// Every op of the req dialect, in its custom syntax: req.queue, req.sort,
// req.select, req.schedule (prefill, decode, mixed), req.defer (every deferral
// reason), req.reject (every rejection reason), req.preempt (recompute, swap).

sched.step 1 {token_budget = 128, max_seqs = 8, block_size = 16, free_blocks = 40, cached_free_blocks = 4, total_blocks = 64, max_model_len = 2048, policy = "fcfs", facts = []} {
  %run = req.queue running {id = [1, 2, 3, 4], prompt = [10, 20, 30, 40], computed = [12, 20, 30, 41], total = [13, 22, 31, 41], max_tokens = [32, 32, 32, 32], priority = [0, 0, 1, 1], arrival = [5, 6, 7, 8], status = [running, running, running, running], blocks = [1, 2, 2, 3]}
  %w = req.queue waiting {id = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19], prompt = [5, 6, 7, 8, 9, 10, 11, 12, 3000, 900], computed = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0], total = [5, 6, 7, 8, 9, 10, 11, 12, 3000, 900], max_tokens = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1], priority = [3, 2, 1, 0, 0, 0, 0, 0, 0, 0], arrival = [9, 8, 7, 6, 5, 4, 3, 2, 1, 0], status = [waiting, preempted, swapped, waiting, waiting, waiting, waiting, waiting, waiting, waiting], blocks = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0], lane = [7, 7, 7, 7, 7, 7, 7, 7, 7, 7]}
  %q = req.queue "my queue" {id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = []} attributes {note = "empty"}
  %s = req.sort %w by ["priority", "arrival desc"] {id = [13, 14, 15, 16, 17, 18, 19, 12, 11, 10]}
  %k = req.select %s {id = [13, 14, 15, 16, 17, 18, 19, 12, 11]}
  %d = req.schedule %run decode {id = [1], tokens = [1]}
  %m = req.schedule %run mixed {id = [2], tokens = [2]}
  %p = req.schedule %k prefill {id = [13], tokens = [8]}
  req.defer %k {id = [14, 15, 16, 17, 12, 11], reason = [budget, max_seqs, memory, blocked, policy, in_flight]}
  req.reject %k {id = [18, 19], reason = [too_long, exceeds_cache]}
  %pr = req.preempt %run recompute {id = [3]}
  %ps = req.preempt %run swap {id = [4]} attributes {why = "test"}
  req.defer %s {id = [10], reason = [budget]}
  sched.yield %d, %m, %p
}

// CHECK:      builtin.module {
// CHECK-NEXT:   sched.step 1 {token_budget = 128, max_seqs = 8, block_size = 16, free_blocks = 40, cached_free_blocks = 4, total_blocks = 64, max_model_len = 2048, policy = "fcfs", facts = []} {
// CHECK-NEXT:     %run = req.queue running {id = [1, 2, 3, 4], prompt = [10, 20, 30, 40], computed = [12, 20, 30, 41], total = [13, 22, 31, 41], max_tokens = [32, 32, 32, 32], priority = [0, 0, 1, 1], arrival = [5, 6, 7, 8], status = [running, running, running, running], blocks = [1, 2, 2, 3]}
// CHECK-NEXT:     %w = req.queue waiting {id = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19], prompt = [5, 6, 7, 8, 9, 10, 11, 12, 3000, 900], computed = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0], total = [5, 6, 7, 8, 9, 10, 11, 12, 3000, 900], max_tokens = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1], priority = [3, 2, 1, 0, 0, 0, 0, 0, 0, 0], arrival = [9, 8, 7, 6, 5, 4, 3, 2, 1, 0], status = [waiting, preempted, swapped, waiting, waiting, waiting, waiting, waiting, waiting, waiting], blocks = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0], lane = [7, 7, 7, 7, 7, 7, 7, 7, 7, 7]}
// CHECK-NEXT:     %q = req.queue "my queue" {id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = []} attributes {note = "empty"}
// CHECK-NEXT:     %s = req.sort %w by ["priority", "arrival desc"] {id = [13, 14, 15, 16, 17, 18, 19, 12, 11, 10]}
// CHECK-NEXT:     %k = req.select %s {id = [13, 14, 15, 16, 17, 18, 19, 12, 11]}
// CHECK-NEXT:     %d = req.schedule %run decode {id = [1], tokens = [1]}
// CHECK-NEXT:     %m = req.schedule %run mixed {id = [2], tokens = [2]}
// CHECK-NEXT:     %p = req.schedule %k prefill {id = [13], tokens = [8]}
// CHECK-NEXT:     req.defer %k {id = [14, 15, 16, 17, 12, 11], reason = [budget, max_seqs, memory, blocked, policy, in_flight]}
// CHECK-NEXT:     req.reject %k {id = [18, 19], reason = [too_long, exceeds_cache]}
// CHECK-NEXT:     %pr = req.preempt %run recompute {id = [3]}
// CHECK-NEXT:     %ps = req.preempt %run swap {id = [4]} attributes {why = "test"}
// CHECK-NEXT:     req.defer %s {id = [10], reason = [budget]}
// CHECK-NEXT:     sched.yield %d, %m, %p
// CHECK-NEXT:   }
// CHECK-NEXT: }

// GENERIC:      "builtin.module"() ({
// GENERIC-NEXT:   "sched.step"() <{{{.*}}token_budget = 128 : i64{{.*}}}> ({
// GENERIC-NEXT:     %run = "req.queue"() <{queue = "running", columns = #req.cols<id = [1, 2, 3, 4], prompt = [10, 20, 30, 40], computed = [12, 20, 30, 41], total = [13, 22, 31, 41], max_tokens = [32, 32, 32, 32], priority = [0, 0, 1, 1], arrival = [5, 6, 7, 8], status = [running, running, running, running], blocks = [1, 2, 2, 3]>}> : () -> !req.set
// GENERIC-NEXT:     %w = "req.queue"() <{queue = "waiting", columns = #req.cols<id = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19], {{.*}}, lane = [7, 7, 7, 7, 7, 7, 7, 7, 7, 7]>}> : () -> !req.set
// GENERIC-NEXT:     %q = "req.queue"() <{queue = "my queue", columns = #req.cols<id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = []>}> {note = "empty"} : () -> !req.set
// GENERIC-NEXT:     %s = "req.sort"(%w) <{by = ["priority", "arrival desc"], columns = #req.cols<id = [13, 14, 15, 16, 17, 18, 19, 12, 11, 10]>}> : (!req.set) -> !req.set
// GENERIC-NEXT:     %k = "req.select"(%s) <{columns = #req.cols<id = [13, 14, 15, 16, 17, 18, 19, 12, 11]>}> : (!req.set) -> !req.set
// GENERIC-NEXT:     %d = "req.schedule"(%run) <{phase = "decode", columns = #req.cols<id = [1], tokens = [1]>}> : (!req.set) -> !req.set
// GENERIC-NEXT:     %m = "req.schedule"(%run) <{phase = "mixed", columns = #req.cols<id = [2], tokens = [2]>}> : (!req.set) -> !req.set
// GENERIC-NEXT:     %p = "req.schedule"(%k) <{phase = "prefill", columns = #req.cols<id = [13], tokens = [8]>}> : (!req.set) -> !req.set
// GENERIC-NEXT:     "req.defer"(%k) <{columns = #req.cols<id = [14, 15, 16, 17, 12, 11], reason = [budget, max_seqs, memory, blocked, policy, in_flight]>}> : (!req.set) -> ()
// GENERIC-NEXT:     "req.reject"(%k) <{columns = #req.cols<id = [18, 19], reason = [too_long, exceeds_cache]>}> : (!req.set) -> ()
// GENERIC-NEXT:     %pr = "req.preempt"(%run) <{mode = "recompute", columns = #req.cols<id = [3]>}> : (!req.set) -> !req.set
// GENERIC-NEXT:     %ps = "req.preempt"(%run) <{mode = "swap", columns = #req.cols<id = [4]>}> {why = "test"} : (!req.set) -> !req.set
// GENERIC-NEXT:     "req.defer"(%s) <{columns = #req.cols<id = [10], reason = [budget]>}> : (!req.set) -> ()
// GENERIC-NEXT:     "sched.yield"(%d, %m, %p) : (!req.set, !req.set, !req.set) -> ()
// GENERIC-NEXT:   }) : () -> ()
// GENERIC-NEXT: }) : () -> ()
