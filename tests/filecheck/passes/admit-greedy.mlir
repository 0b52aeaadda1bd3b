// RUN: schedir opt %s -p "admit-greedy{chunk=false}" | filecheck %s --check-prefixes=CHECK,GREEDY,NOSTOP
// RUN: schedir opt %s -p "admit-greedy{chunk=false stop-at-first=true}" | filecheck %s --check-prefixes=CHECK,STOP
// RUN: schedir opt %s -p admit-greedy | filecheck %s --check-prefixes=CHECK,CHUNK,NOSTOP
// RUN: schedir opt %s -p "admit-greedy{chunk=true}" | filecheck %s --check-prefixes=CHECK,CHUNK,NOSTOP
// RUN: schedir opt %s -p "admit-greedy{chunk=false},verify-step" | filecheck %s --check-prefixes=CHECK,GREEDY,NOSTOP
// RUN: schedir opt %s -p admit-greedy,verify-step | filecheck %s --check-prefixes=CHECK,CHUNK,NOSTOP

// admit-greedy walks the pending waiting set in order and schedules (prefill)
// each request that fits the remaining token budget, max_seqs and free blocks,
// after what earlier decisions in the step already use. A misfit is deferred
// with its reason and the walk goes on; with stop-at-first every request
// behind the first misfit is deferred as blocked; with chunk (the default) a
// prompt larger than the remaining budget gets a partial chunk (chunk=false:
// the seed's admission, where it waits for a step with budget enough). It requires the facts
// "order" and "running-scheduled": every step below records them.
//
// Prefix hits (mem.match): the usable hit is the full blocks of at most
// total - 1 tokens, so a full-prompt hit still computes its last token. The
// hit blocks not yet held are shared (mem.share); `revived` counts those that
// sat in the free queue (cached_free), which are charged against free blocks
// like an allocation. New blocks: ceil(total computed after this step / 16)
// - held - shared -> mem.alloc.

// Token budget 64, in arrival order (the pending set is the req.sort):
//   10: 30 -> 30 (34 left)      11: 30 -> 30 (4 left)
//   12: 10 -> budget; chunk: 4 tokens (0 left); stop-at-first: budget, then all blocked
//   13: 4  -> 4 (0 left); chunk: budget
//   14: 1  -> budget
sched.step 1 {token_budget = 64, max_seqs = 8, block_size = 16, free_blocks = 20, cached_free_blocks = 0, total_blocks = 40, max_model_len = 1024, policy = "fcfs", facts = ["order", "running-scheduled"]} {
  %w1 = req.queue waiting {id = [14, 13, 12, 11, 10], prompt = [1, 4, 10, 30, 30], computed = [0, 0, 0, 0, 0], total = [1, 4, 10, 30, 30], max_tokens = [8, 8, 8, 8, 8], priority = [0, 0, 0, 0, 0], arrival = [5, 4, 3, 2, 1], status = [waiting, waiting, waiting, waiting, waiting], blocks = [0, 0, 0, 0, 0]}
  %s1 = req.sort %w1 by ["arrival"] {id = [10, 11, 12, 13, 14]}
}

// CHECK-LABEL:  sched.step 1
// CHECK-SAME:     facts = [{{.*}}"waiting-scheduled"]
// CHECK:          %s1 = req.sort
// GREEDY-NEXT:    %[[A1:[0-9]+]] = req.schedule %s1 prefill {id = [10, 11, 13], tokens = [30, 30, 4]}
// GREEDY-NEXT:    mem.alloc %[[A1]] {id = [10, 11, 13], blocks = [2, 2, 1]}
// GREEDY-NEXT:    req.defer %s1 {id = [12, 14], reason = [budget, budget]}
// STOP-NEXT:      %[[A1:[0-9]+]] = req.schedule %s1 prefill {id = [10, 11], tokens = [30, 30]}
// STOP-NEXT:      mem.alloc %[[A1]] {id = [10, 11], blocks = [2, 2]}
// STOP-NEXT:      req.defer %s1 {id = [12, 13, 14], reason = [budget, blocked, blocked]}
// CHUNK-NEXT:     %[[A1:[0-9]+]] = req.schedule %s1 prefill {id = [10, 11, 12], tokens = [30, 30, 4]}
// CHUNK-NEXT:     mem.alloc %[[A1]] {id = [10, 11, 12], blocks = [2, 2, 1]}
// CHUNK-NEXT:     req.defer %s1 {id = [13, 14], reason = [budget, budget]}
// CHECK-NEXT:     sched.yield %[[A1]]
// CHECK-NEXT:   }

// max_seqs = 2, one taken by the running decode already in the step: 20 runs,
// 21 and 22 are deferred for max_seqs (stop-at-first: 22 is blocked behind 21).
// The decode's block is counted too: 2 - 1 = 1 block free is enough for 20.
sched.step 2 {token_budget = 64, max_seqs = 2, block_size = 16, free_blocks = 2, cached_free_blocks = 0, total_blocks = 40, max_model_len = 1024, policy = "fcfs", facts = ["order", "running-scheduled"]} {
  %run2 = req.queue running {id = [1], prompt = [10], computed = [16], total = [17], max_tokens = [32], priority = [0], arrival = [0], status = [running], blocks = [1]}
  %w2 = req.queue waiting {id = [20, 21, 22], prompt = [5, 5, 5], computed = [0, 0, 0], total = [5, 5, 5], max_tokens = [8, 8, 8], priority = [0, 0, 0], arrival = [1, 2, 3], status = [waiting, waiting, waiting], blocks = [0, 0, 0]}
  %d2 = req.schedule %run2 decode {id = [1], tokens = [1]}
  mem.alloc %d2 {id = [1], blocks = [1]}
  sched.yield %d2
}

// CHECK-LABEL:  sched.step 2
// CHECK:          mem.alloc %d2 {id = [1], blocks = [1]}
// CHECK-NEXT:     %[[A2:[0-9]+]] = req.schedule %w2 prefill {id = [20], tokens = [5]}
// CHECK-NEXT:     mem.alloc %[[A2]] {id = [20], blocks = [1]}
// GREEDY-NEXT:    req.defer %w2 {id = [21, 22], reason = [max_seqs, max_seqs]}
// STOP-NEXT:      req.defer %w2 {id = [21, 22], reason = [max_seqs, blocked]}
// CHUNK-NEXT:     req.defer %w2 {id = [21, 22], reason = [max_seqs, max_seqs]}
// CHECK-NEXT:     sched.yield %d2, %[[A2]]
// CHECK-NEXT:   }

// 3 free blocks of 16:
//   30: 60 tokens = 4 blocks -> memory (chunk does not split for memory)
//   31: 20 tokens = 2 blocks -> runs (1 left)
//   32: 16 tokens = 1 block  -> runs (0 left)
//   33: 1 token              -> memory
sched.step 3 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 3, cached_free_blocks = 0, total_blocks = 40, max_model_len = 1024, policy = "fcfs", facts = ["order", "running-scheduled"]} {
  %w3 = req.queue waiting {id = [30, 31, 32, 33], prompt = [60, 20, 16, 1], computed = [0, 0, 0, 0], total = [60, 20, 16, 1], max_tokens = [8, 8, 8, 8], priority = [0, 0, 0, 0], arrival = [1, 2, 3, 4], status = [waiting, waiting, waiting, waiting], blocks = [0, 0, 0, 0]}
}

// CHECK-LABEL:  sched.step 3
// GREEDY:         %[[A3:[0-9]+]] = req.schedule %w3 prefill {id = [31, 32], tokens = [20, 16]}
// GREEDY-NEXT:    mem.alloc %[[A3]] {id = [31, 32], blocks = [2, 1]}
// GREEDY-NEXT:    req.defer %w3 {id = [30, 33], reason = [memory, memory]}
// GREEDY-NEXT:    sched.yield %[[A3]]
// STOP:           %w3 = req.queue waiting
// STOP-NEXT:      req.defer %w3 {id = [30, 31, 32, 33], reason = [memory, blocked, blocked, blocked]}
// STOP-NEXT:      sched.yield{{$}}
// CHUNK:          %[[A3:[0-9]+]] = req.schedule %w3 prefill {id = [31, 32], tokens = [20, 16]}
// CHUNK-NEXT:     mem.alloc %[[A3]] {id = [31, 32], blocks = [2, 1]}
// CHUNK-NEXT:     req.defer %w3 {id = [30, 33], reason = [memory, memory]}
// CHUNK-NEXT:     sched.yield %[[A3]]

// Prefix hits, block size 16, 10 free blocks:
//   40: 100 tokens, hit 64 (4 blocks, 2 of them cached-free): 36 tokens from 64;
//       share 4 (revived 2), alloc ceil(100/16) - 4 = 3; 5 blocks leave the pool
//   41: 32 tokens, all hit: only 16 usable (the last token is computed), 16 tokens;
//       share 1, alloc 1
//   42: 33 tokens, hit 32: 2 blocks usable, 1 token; share 2, alloc 1
//   43: 40 tokens, hit 20: 1 full block usable, 24 tokens; share 1, alloc 2
//   44: 60 tokens, 48 already computed in 3 held blocks, hit 32: nothing to
//       share, 12 tokens from 48, alloc 1
//   45: 64 tokens, 16 computed in 1 held block, hit 48: share the 2 other
//       hit blocks, 16 tokens from 48, alloc 1
// Blocks leaving the pool: 5 + 1 + 1 + 2 + 1 + 1 = 11 > 10: 45 is deferred for memory.
sched.step 4 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 40, max_model_len = 1024, policy = "fcfs", facts = ["order", "running-scheduled"]} {
  %w4 = req.queue waiting {id = [40, 41, 42, 43, 44, 45], prompt = [100, 32, 33, 40, 60, 64], computed = [0, 0, 0, 0, 48, 16], total = [100, 32, 33, 40, 60, 64], max_tokens = [8, 8, 8, 8, 8, 8], priority = [0, 0, 0, 0, 0, 0], arrival = [1, 2, 3, 4, 5, 6], status = [waiting, waiting, waiting, waiting, preempted, preempted], blocks = [0, 0, 0, 0, 3, 1]}
  mem.match %w4 {id = [40, 41, 42, 43, 44, 45], hit = [64, 32, 32, 20, 32, 48], cached_free = [2, 0, 0, 0, 0, 0]}
}

// CHECK-LABEL:  sched.step 4
// CHECK:          mem.match %w4
// CHECK-NEXT:     %[[A4:[0-9]+]] = req.schedule %w4 prefill {id = [40, 41, 42, 43, 44], tokens = [36, 16, 1, 24, 12]}
// CHECK-NEXT:     mem.share %[[A4]] {id = [40, 41, 42, 43], blocks = [4, 1, 2, 1], revived = [2, 0, 0, 0]}
// CHECK-NEXT:     mem.alloc %[[A4]] {id = [40, 41, 42, 43, 44], blocks = [3, 1, 1, 2, 1]}
// CHECK-NEXT:     req.defer %w4 {id = [45], reason = [memory]}
// CHECK-NEXT:     sched.yield %[[A4]]

// Revived blocks count against free blocks: 2 free. 50 needs 1 new block but
// revives 2 cached-free hit blocks (3 > 2): memory. 51 has the same hit with
// its blocks still referenced (not cached-free): 1 new block, it runs.
sched.step 5 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 2, cached_free_blocks = 2, total_blocks = 40, max_model_len = 1024, policy = "fcfs", facts = ["order", "running-scheduled"]} {
  %w5 = req.queue waiting {id = [50, 51], prompt = [40, 40], computed = [0, 0], total = [40, 40], max_tokens = [8, 8], priority = [0, 0], arrival = [1, 2], status = [waiting, waiting], blocks = [0, 0]}
  mem.match %w5 {id = [50, 51], hit = [32, 32], cached_free = [2, 0]}
}

// CHECK-LABEL:  sched.step 5
// CHECK:          mem.match %w5
// NOSTOP-NEXT:    %[[A5:[0-9]+]] = req.schedule %w5 prefill {id = [51], tokens = [8]}
// NOSTOP-NEXT:    mem.share %[[A5]] {id = [51], blocks = [2], revived = [0]}
// NOSTOP-NEXT:    mem.alloc %[[A5]] {id = [51], blocks = [1]}
// NOSTOP-NEXT:    req.defer %w5 {id = [50], reason = [memory]}
// STOP-NEXT:      req.defer %w5 {id = [50, 51], reason = [memory, blocked]}

// A waiting request with nothing left to compute is in_flight (and does not
// stop the walk under stop-at-first). Token budget 10:
//   60: in_flight   61: 20 tokens -> budget; chunk: 10 tokens   62: 5 tokens -> runs; chunk: budget
sched.step 6 {token_budget = 10, max_seqs = 8, block_size = 16, free_blocks = 10, cached_free_blocks = 0, total_blocks = 40, max_model_len = 1024, policy = "fcfs", facts = ["order", "running-scheduled"]} {
  %w6 = req.queue waiting {id = [60, 61, 62], prompt = [8, 20, 5], computed = [8, 0, 0], total = [8, 20, 5], max_tokens = [8, 8, 8], priority = [0, 0, 0], arrival = [1, 2, 3], status = [waiting, waiting, waiting], blocks = [1, 0, 0]}
}

// CHECK-LABEL:  sched.step 6
// GREEDY:         %[[A6:[0-9]+]] = req.schedule %w6 prefill {id = [62], tokens = [5]}
// GREEDY-NEXT:    mem.alloc %[[A6]] {id = [62], blocks = [1]}
// GREEDY-NEXT:    req.defer %w6 {id = [60, 61], reason = [in_flight, budget]}
// STOP:           req.defer %w6 {id = [60, 61, 62], reason = [in_flight, budget, blocked]}
// CHUNK:          %[[A6:[0-9]+]] = req.schedule %w6 prefill {id = [61], tokens = [10]}
// CHUNK-NEXT:     mem.alloc %[[A6]] {id = [61], blocks = [1]}
// CHUNK-NEXT:     req.defer %w6 {id = [60, 62], reason = [in_flight, budget]}

// No waiting queue, or an empty one: nothing.
sched.step 7 {token_budget = 10, max_seqs = 8, block_size = 16, free_blocks = 10, cached_free_blocks = 0, total_blocks = 40, max_model_len = 1024, policy = "fcfs", facts = ["order", "running-scheduled"]} {
  %w7 = req.queue waiting {id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = []}
}

// CHECK-LABEL:  sched.step 7
// CHECK-NEXT:     %w7 = req.queue waiting
// CHECK-NEXT:     sched.yield
// CHECK-NEXT:   }
