// RUN: schedir opt %s -p "verify-step{complete=false}" | filecheck %s
// RUN: not schedir opt %s -p verify-step 2>&1 | filecheck %s --check-prefix=COMPLETE
// RUN: sh -c 'schedir opt %s -p verify-step > /dev/null 2>&1; echo "exit code $?"' | filecheck %s --check-prefix=EXIT

// Legal steps for verify-step at their limits. Without complete they pass
// unchanged (but for the "budget-legal" fact); with complete (the default)
// step 3 fails: its waiting request 22 has no decision.

// Exactly the budgets: 16 tokens of 16, 2 requests of 2, 2 blocks of 2 free.
sched.step 1 {token_budget = 16, max_seqs = 2, block_size = 16, free_blocks = 2, cached_free_blocks = 0, total_blocks = 8, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run1 = req.queue running {id = [1], prompt = [10], computed = [16], total = [17], max_tokens = [32], priority = [0], arrival = [1], status = [running], blocks = [1]}
  %w1 = req.queue waiting {id = [10], prompt = [15], computed = [0], total = [15], max_tokens = [8], priority = [0], arrival = [2], status = [waiting], blocks = [0]}
  %d1 = req.schedule %run1 decode {id = [1], tokens = [1]}
  mem.alloc %d1 {id = [1], blocks = [1]}
  %a1 = req.schedule %w1 prefill {id = [10], tokens = [15]}
  mem.alloc %a1 {id = [10], blocks = [1]}
  sched.yield %d1, %a1
}

// CHECK-LABEL: sched.step 1
// CHECK-SAME:    facts = ["budget-legal"]
// CHECK:         sched.yield %d1, %a1

// Blocks given back count: 1 block free, request 2 preempted by recompute
// frees 2, swapped-out request 3 frees 1: 4 in all. 1 goes to request 1's
// decode, 2 are swapped in for request 9 (they cover its tokens), 1 to request
// 20: a full-prompt hit (40 of 40 tokens, 2 blocks usable, 1 of them already
// held) lets it compute its last 8 tokens from 32 in 1 held + 1 shared + 1 new
// block. 1 cached-free block is evicted.
sched.step 2 {token_budget = 16, max_seqs = 4, block_size = 16, free_blocks = 1, cached_free_blocks = 1, total_blocks = 8, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run2 = req.queue running {id = [1, 2, 3], prompt = [10, 20, 20], computed = [16, 20, 20], total = [17, 21, 21], max_tokens = [32, 32, 32], priority = [0, 0, 0], arrival = [1, 2, 3], status = [running, running, running], blocks = [1, 2, 1]}
  %sw2 = req.queue swapped {id = [9], prompt = [20], computed = [20], total = [21], max_tokens = [32], priority = [0], arrival = [0], status = [swapped], blocks = [0]}
  %w2 = req.queue waiting {id = [20], prompt = [40], computed = [0], total = [40], max_tokens = [8], priority = [0], arrival = [4], status = [waiting], blocks = [1]}
  mem.match %w2 {id = [20], hit = [40]}
  %p2 = req.preempt %run2 recompute {id = [2]}
  mem.free %p2 {id = [2], blocks = [2]}
  %o2 = req.preempt %run2 swap {id = [3]}
  mem.swap_out %o2 {id = [3], blocks = [1]}
  %d2 = req.schedule %run2 decode {id = [1], tokens = [1]}
  mem.alloc %d2 {id = [1], blocks = [1]}
  %i2 = req.schedule %sw2 decode {id = [9], tokens = [1]}
  mem.swap_in %i2 {id = [9], blocks = [2]}
  %a2 = req.schedule %w2 prefill {id = [20], tokens = [8]}
  mem.share %a2 {id = [20], blocks = [1]}
  mem.alloc %a2 {id = [20], blocks = [1]}
  mem.evict 1
  sched.yield %d2, %i2, %a2
}

// CHECK-LABEL: sched.step 2
// CHECK-SAME:    facts = ["budget-legal"]
// CHECK:         mem.evict 1
// CHECK-NEXT:    sched.yield %d2, %i2, %a2

// Incomplete: request 22 has no decision.
sched.step 3 {token_budget = 16, max_seqs = 4, block_size = 16, free_blocks = 1, cached_free_blocks = 0, total_blocks = 8, max_model_len = 1024, policy = "fcfs", facts = []} {
  %w3 = req.queue waiting {id = [20, 21, 22], prompt = [8, 8, 8], computed = [0, 0, 0], total = [8, 8, 8], max_tokens = [8, 8, 8], priority = [0, 0, 0], arrival = [1, 2, 3], status = [waiting, waiting, waiting], blocks = [0, 0, 0]}
  %a3 = req.schedule %w3 prefill {id = [20], tokens = [8]}
  mem.alloc %a3 {id = [20], blocks = [1]}
  req.defer %w3 {id = [21], reason = [memory]}
  sched.yield %a3
}

// CHECK-LABEL: sched.step 3
// CHECK-SAME:    facts = ["budget-legal"]

// COMPLETE: schedir: error: pass 'verify-step': step 3 is illegal: request(s) [22] of queue 'waiting' have no decision (schedule, defer, reject or preempt){{$}}
// EXIT: exit code 1
