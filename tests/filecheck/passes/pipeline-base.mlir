// RUN: schedir opt %s -p base | filecheck %s
// RUN: schedir opt %s -p base | schedir opt - | filecheck %s
// RUN: schedir opt %s -p reject-oversized,order-fcfs,schedule-running,admit-greedy,verify-step | filecheck %s
// RUN: schedir opt %s -p "reject-oversized,order-fcfs,schedule-running,admit-greedy{chunk=false},verify-step" | filecheck %s --check-prefix=UNCHUNKED
// RUN: schedir opt %s -p base --print-ir-after-all 2>&1 >/dev/null | filecheck %s --check-prefix=AFTER-ALL
// RUN: schedir opt %s -p base-priority | filecheck %s --check-prefix=PRIORITY
// RUN: not schedir opt %s -p admit-greedy 2>&1 | filecheck %s --check-prefix=MISSING
// RUN: sh -c 'schedir opt %s -p admit-greedy,order-fcfs > /dev/null 2>&1; echo "exit code $?"' | filecheck %s --check-prefix=EXIT
// RUN: not schedir opt %s -p "base{chunk=true}" 2>&1 | filecheck %s --check-prefix=PRESET-OPTIONS

// The `base` preset end to end: reject-oversized, order-fcfs, schedule-running,
// admit-greedy (which chunks by default), verify-step.
//
// Token budget 80, max_seqs 7, 10 free blocks of 16 (1 cached-free), 20 blocks
// in all (320 tokens), max_model_len 512.
// Running, in queue order:
//   1: decode crossing into a new block   -> 1 token, 1 new block
//   2: decode                              -> 1 token
//   3: computed == total                   -> in_flight
//   4: prefill at 64 of 100, 4 blocks      -> 36 tokens, 3 new blocks (mixed batch)
//   => 38 tokens, 4 blocks: 42 tokens and 6 blocks left; 3 sequence slots left (request 3,
//      in flight, keeps its slot: max_seqs caps the running set, not the batch).
// Waiting (arrival order 10, 11, 12, 13, 14, 15, 16):
//   10: 600 tokens > 512                   -> rejected, too_long
//   11: 400 tokens = 25 blocks > 20        -> rejected, exceeds_cache
//   12: 40 tokens, hit 32 (1 cached-free)  -> 8 tokens; share 2 (revived 1), 1 new block
//   13: 30 tokens                          -> 30 tokens, 2 new blocks (4 tokens, 1 block left)
//   14: 10 tokens                          -> a 4-token chunk, 1 new block (7 sequences)
//   15: 2 tokens                           -> max_seqs
//   16: 1 token                            -> max_seqs
// Unchunked (admit-greedy{chunk=false}, the seed's admission), 14 is deferred for
// the budget, and 15 takes the last slot: 2 tokens, 1 new block.
sched.step 9 {token_budget = 80, max_seqs = 7, block_size = 16, free_blocks = 10, cached_free_blocks = 1, total_blocks = 20, max_model_len = 512, policy = "fcfs", facts = []} {
  %run = req.queue running {id = [1, 2, 3, 4], prompt = [16, 20, 30, 100], computed = [16, 20, 30, 64], total = [17, 21, 30, 100], max_tokens = [32, 32, 32, 32], priority = [0, 0, 0, 0], arrival = [1, 2, 3, 4], status = [running, running, running, running], blocks = [1, 2, 2, 4]}
  %w = req.queue waiting {id = [16, 15, 14, 13, 12, 11, 10], prompt = [1, 2, 10, 30, 40, 400, 600], computed = [0, 0, 0, 0, 0, 0, 0], total = [1, 2, 10, 30, 40, 400, 600], max_tokens = [8, 8, 8, 8, 8, 8, 8], priority = [0, 1, 1, 1, 1, 1, 1], arrival = [16, 15, 14, 13, 12, 11, 10], status = [waiting, waiting, waiting, waiting, waiting, waiting, waiting], blocks = [0, 0, 0, 0, 0, 0, 0]}
  mem.match %w {id = [12], hit = [32], cached_free = [1]}
}

// CHECK:      sched.step 9 {token_budget = 80, max_seqs = 7, block_size = 16, free_blocks = 10, cached_free_blocks = 1, total_blocks = 20, max_model_len = 512, policy = "fcfs", facts = ["admissible", "budget-legal", "order", "running-scheduled", "waiting-scheduled"]} {
// CHECK-NEXT:   %run = req.queue running
// CHECK-NEXT:   %w = req.queue waiting
// CHECK-NEXT:   mem.match %w {id = [12], hit = [32], cached_free = [1]}
// CHECK-NEXT:   req.reject %w {id = [11, 10], reason = [exceeds_cache, too_long]}
// CHECK-NEXT:   %[[KEPT:[0-9]+]] = req.select %w {id = [16, 15, 14, 13, 12]}
// CHECK-NEXT:   %[[SORTED:[0-9]+]] = req.sort %[[KEPT]] by ["arrival"] {id = [12, 13, 14, 15, 16]}
// CHECK-NEXT:   %[[RUNNING:[0-9]+]] = req.schedule %run mixed {id = [1, 2, 4], tokens = [1, 1, 36]}
// CHECK-NEXT:   mem.alloc %[[RUNNING]] {id = [1, 4], blocks = [1, 3]}
// CHECK-NEXT:   req.defer %run {id = [3], reason = [in_flight]}
// CHECK-NEXT:   %[[ADMITTED:[0-9]+]] = req.schedule %[[SORTED]] prefill {id = [12, 13, 14], tokens = [8, 30, 4]}
// CHECK-NEXT:   mem.share %[[ADMITTED]] {id = [12], blocks = [2], revived = [1]}
// CHECK-NEXT:   mem.alloc %[[ADMITTED]] {id = [12, 13, 14], blocks = [1, 2, 1]}
// CHECK-NEXT:   req.defer %[[SORTED]] {id = [15, 16], reason = [max_seqs, max_seqs]}
// CHECK-NEXT:   sched.yield %[[RUNNING]], %[[ADMITTED]]
// CHECK-NEXT: }

// UNCHUNKED:      %[[ADMITTED:[0-9]+]] = req.schedule %{{[0-9]+}} prefill {id = [12, 13, 15], tokens = [8, 30, 2]}
// UNCHUNKED-NEXT: mem.share %[[ADMITTED]] {id = [12], blocks = [2], revived = [1]}
// UNCHUNKED-NEXT: mem.alloc %[[ADMITTED]] {id = [12, 13, 15], blocks = [1, 2, 1]}
// UNCHUNKED-NEXT: req.defer %{{[0-9]+}} {id = [14, 16], reason = [budget, max_seqs]}

// AFTER-ALL:      IR after input
// AFTER-ALL-NOT:  req.reject
// AFTER-ALL:      IR after reject-oversized
// AFTER-ALL:      req.reject
// AFTER-ALL-NOT:  req.sort
// AFTER-ALL:      IR after order-fcfs
// AFTER-ALL:      req.sort
// AFTER-ALL-NOT:  req.schedule
// AFTER-ALL:      IR after schedule-running
// AFTER-ALL:      req.schedule %run mixed
// AFTER-ALL-NOT:  prefill
// AFTER-ALL:      IR after admit-greedy
// AFTER-ALL:      prefill
// AFTER-ALL:      IR after verify-step
// AFTER-ALL-NOT:  IR after

// base-priority: request 16 (priority 0) goes first and takes the sixth
// sequence slot left before 15: 14 and 15 are deferred for max_seqs (max_seqs is
// checked before the budget).
// PRIORITY:      %[[SORTED:[0-9]+]] = req.sort %{{[0-9]+}} by ["priority", "arrival"] {id = [16, 12, 13, 14, 15]}
// PRIORITY:      %[[ADMITTED:[0-9]+]] = req.schedule %[[SORTED]] prefill {id = [16, 12, 13], tokens = [1, 8, 30]}
// PRIORITY-NEXT: mem.share %[[ADMITTED]] {id = [12], blocks = [2], revived = [1]}
// PRIORITY-NEXT: mem.alloc %[[ADMITTED]] {id = [16, 12, 13], blocks = [1, 1, 2]}
// PRIORITY-NEXT: req.defer %[[SORTED]] {id = [14, 15], reason = [max_seqs, max_seqs]}

// A pipeline whose requirements are not met is refused before anything runs
// (exit code 2), with a hint.
// MISSING: schedir: error: pass 'admit-greedy' (#1) requires 'order', which no earlier pass provides; add one of: {{.*}}order-fcfs, order-priority{{.*}} before it
// EXIT: exit code 2
// PRESET-OPTIONS: schedir: error: preset 'base' takes no options; give them to its passes instead
