// RUN: schedir opt %s | schedir opt - | filecheck %s
// RUN: schedir opt %s --generic | schedir opt - | filecheck %s
// RUN: schedir opt %s --generic | filecheck %s --check-prefix=GENERIC

// Every op of the mem dialect, in its custom syntax: mem.match (with and
// without cached_free), mem.share (with and without revived), mem.alloc,
// mem.free, mem.evict, mem.swap_out, mem.swap_in, mem.copy.

sched.step 7 {token_budget = 256, max_seqs = 8, block_size = 16, free_blocks = 30, cached_free_blocks = 6, total_blocks = 64, max_model_len = 4096, policy = "fcfs", facts = []} {
  %run = req.queue running {id = [1, 2, 3], prompt = [100, 50, 40], computed = [110, 60, 40], total = [111, 61, 41], max_tokens = [64, 64, 64], priority = [0, 0, 0], arrival = [1, 2, 3], status = [running, running, running], blocks = [7, 4, 3]}
  %sw = req.queue swapped {id = [9], prompt = [64], computed = [70], total = [71], max_tokens = [64], priority = [0], arrival = [0], status = [swapped], blocks = [0]}
  %w = req.queue waiting {id = [4, 5], prompt = [64, 20], computed = [0, 0], total = [64, 20], max_tokens = [8, 8], priority = [0, 0], arrival = [4, 5], status = [waiting, waiting], blocks = [0, 0]}
  mem.match %w {id = [4, 5], hit = [48, 0], cached_free = [2, 0]}
  mem.match %sw {id = [9], hit = [0]}
  %pr = req.preempt %run swap {id = [3]}
  mem.swap_out %pr {id = [3], blocks = [3]}
  %d = req.schedule %run decode {id = [1, 2], tokens = [1, 1]}
  mem.alloc %d {id = [1], blocks = [1]}
  %si = req.schedule %sw decode {id = [9], tokens = [1]}
  mem.swap_in %si {id = [9], blocks = [5]}
  %a = req.schedule %w prefill {id = [4, 5], tokens = [16, 20]}
  mem.share %a {id = [4], blocks = [3], revived = [2]}
  mem.share %a {id = [5], blocks = [0]}
  mem.copy %a {id = [4], blocks = [1]}
  mem.alloc %a {id = [4, 5], blocks = [1, 2]}
  mem.free %run {id = [2], blocks = [0]} attributes {note = "nothing to free"}
  mem.evict 2
  mem.evict 0 attributes {why = "none"}
  sched.yield %d, %si, %a
}

// CHECK:      builtin.module {
// CHECK-NEXT:   sched.step 7 {token_budget = 256, max_seqs = 8, block_size = 16, free_blocks = 30, cached_free_blocks = 6, total_blocks = 64, max_model_len = 4096, policy = "fcfs", facts = []} {
// CHECK-NEXT:     %run = req.queue running {id = [1, 2, 3], {{.*}}, blocks = [7, 4, 3]}
// CHECK-NEXT:     %sw = req.queue swapped {id = [9], {{.*}}, status = [swapped], blocks = [0]}
// CHECK-NEXT:     %w = req.queue waiting {id = [4, 5], {{.*}}}
// CHECK-NEXT:     mem.match %w {id = [4, 5], hit = [48, 0], cached_free = [2, 0]}
// CHECK-NEXT:     mem.match %sw {id = [9], hit = [0]}
// CHECK-NEXT:     %pr = req.preempt %run swap {id = [3]}
// CHECK-NEXT:     mem.swap_out %pr {id = [3], blocks = [3]}
// CHECK-NEXT:     %d = req.schedule %run decode {id = [1, 2], tokens = [1, 1]}
// CHECK-NEXT:     mem.alloc %d {id = [1], blocks = [1]}
// CHECK-NEXT:     %si = req.schedule %sw decode {id = [9], tokens = [1]}
// CHECK-NEXT:     mem.swap_in %si {id = [9], blocks = [5]}
// CHECK-NEXT:     %a = req.schedule %w prefill {id = [4, 5], tokens = [16, 20]}
// CHECK-NEXT:     mem.share %a {id = [4], blocks = [3], revived = [2]}
// CHECK-NEXT:     mem.share %a {id = [5], blocks = [0]}
// CHECK-NEXT:     mem.copy %a {id = [4], blocks = [1]}
// CHECK-NEXT:     mem.alloc %a {id = [4, 5], blocks = [1, 2]}
// CHECK-NEXT:     mem.free %run {id = [2], blocks = [0]} attributes {note = "nothing to free"}
// CHECK-NEXT:     mem.evict 2
// CHECK-NEXT:     mem.evict 0 attributes {why = "none"}
// CHECK-NEXT:     sched.yield %d, %si, %a
// CHECK-NEXT:   }
// CHECK-NEXT: }

// GENERIC:      "mem.match"(%w) <{columns = #req.cols<id = [4, 5], hit = [48, 0], cached_free = [2, 0]>}> : (!req.set) -> ()
// GENERIC-NEXT: "mem.match"(%sw) <{columns = #req.cols<id = [9], hit = [0]>}> : (!req.set) -> ()
// GENERIC:      "mem.swap_out"(%pr) <{columns = #req.cols<id = [3], blocks = [3]>}> : (!req.set) -> ()
// GENERIC:      "mem.alloc"(%d) <{columns = #req.cols<id = [1], blocks = [1]>}> : (!req.set) -> ()
// GENERIC:      "mem.swap_in"(%si) <{columns = #req.cols<id = [9], blocks = [5]>}> : (!req.set) -> ()
// GENERIC:      "mem.share"(%a) <{columns = #req.cols<id = [4], blocks = [3], revived = [2]>}> : (!req.set) -> ()
// GENERIC-NEXT: "mem.share"(%a) <{columns = #req.cols<id = [5], blocks = [0]>}> : (!req.set) -> ()
// GENERIC-NEXT: "mem.copy"(%a) <{columns = #req.cols<id = [4], blocks = [1]>}> : (!req.set) -> ()
// GENERIC-NEXT: "mem.alloc"(%a) <{columns = #req.cols<id = [4, 5], blocks = [1, 2]>}> : (!req.set) -> ()
// GENERIC-NEXT: "mem.free"(%run) <{columns = #req.cols<id = [2], blocks = [0]>}> {note = "nothing to free"} : (!req.set) -> ()
// GENERIC-NEXT: "mem.evict"() <{blocks = 2 : i64}> : () -> ()
// GENERIC-NEXT: "mem.evict"() <{blocks = 0 : i64}> {why = "none"} : () -> ()
// GENERIC-NEXT: "sched.yield"(%d, %si, %a) : (!req.set, !req.set, !req.set) -> ()
