// RUN: schedir opt %s -p schedule-running | filecheck %s --check-prefixes=CHECK,CHUNK,PREEMPT
// RUN: schedir opt %s -p "schedule-running{chunk=false}" | filecheck %s --check-prefixes=CHECK,NOCHUNK,PREEMPT
// RUN: schedir opt %s -p "schedule-running{preempt=false}" | filecheck %s --check-prefixes=CHECK,CHUNK,NOPREEMPT
// RUN: schedir opt %s -p schedule-running,verify-step | filecheck %s --check-prefixes=CHECK,CHUNK,PREEMPT

// schedule-running walks the pending running set in order and gives each
// request the tokens it still needs (total - computed: 1 for a decode), under
// the remaining token budget, max_seqs and free blocks. A request that does not
// fit is deferred with its reason (max_seqs is checked first, then the budget,
// then blocks); one with nothing left to compute (total == computed: its last
// tokens have not come back) is deferred in_flight.
// Short of blocks (preempt, the default), it preempts by recompute the requests
// behind it that are not decided or in flight, lowest first (FCFS: the last;
// priority: the largest (priority, arrival)), until their held blocks cover the
// shortfall, and waits (memory): this pass sees counts, not the pool, so the
// victims' blocks count as free from the next step (no mem.free). With none to
// take, none in flight behind it and no one preempted yet, it preempts itself.
// New blocks: ceil((computed + tokens) / block_size) - blocks held -> mem.alloc.
// The phase is decode when every scheduled request needs exactly 1 token, else
// mixed. With chunk (the default), a running prefill takes what budget is left.

// Decodes and blocks: block_size 16, 2 free blocks.
//   1: 17 tokens in 1 block  -> 1 token, 1 new block
//   2: 6 tokens in 1 block   -> 1 token
//   3: 33 tokens in 2 blocks -> 1 token, 1 new block (the last free one)
//   4: 49 tokens in 3 blocks -> needs a block, none left: memory; preempt: 6 (the last
//                               not in flight) is preempted for it
//   5: computed == total     -> in_flight
//   6: 8 tokens in 1 block   -> 1 token (the walk goes on past a misfit); preempt: gone
sched.step 1 {token_budget = 64, max_seqs = 8, block_size = 16, free_blocks = 2, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run1 = req.queue running {id = [1, 2, 3, 4, 5, 6], prompt = [10, 5, 30, 40, 20, 7], computed = [16, 5, 32, 48, 20, 7], total = [17, 6, 33, 49, 20, 8], max_tokens = [32, 32, 32, 32, 32, 32], priority = [0, 0, 0, 0, 0, 0], arrival = [1, 2, 3, 4, 5, 6], status = [running, running, running, running, running, running], blocks = [1, 1, 2, 3, 2, 1]}
}

// CHECK-LABEL:  sched.step 1
// CHECK-SAME:     facts = [{{.*}}"running-scheduled"{{.*}}]
// CHECK-NEXT:     %run1 = req.queue running
// NOPREEMPT-NEXT: %[[D1:[0-9]+]] = req.schedule %run1 decode {id = [1, 2, 3, 6], tokens = [1, 1, 1, 1]}
// PREEMPT-NEXT:   %[[D1:[0-9]+]] = req.schedule %run1 decode {id = [1, 2, 3], tokens = [1, 1, 1]}
// CHECK-NEXT:     mem.alloc %[[D1]] {id = [1, 3], blocks = [1, 1]}
// PREEMPT-NEXT:   %{{[0-9]+}} = req.preempt %run1 recompute {id = [6]}
// CHECK-NEXT:     req.defer %run1 {id = [4, 5], reason = [memory, in_flight]}
// CHECK-NEXT:     sched.yield %[[D1]]
// CHECK-NEXT:   }

// A running prefill and the token budget (20 tokens):
//   1: decode                                     -> 1 token (19 left)
//   2: prefill of 40 from 0; chunk: 19 tokens, 2 new blocks (0 left); no chunk: budget
//   3: decode -> chunk: budget (none left); no chunk: 1 token, and the batch is all decodes
sched.step 2 {token_budget = 20, max_seqs = 8, block_size = 16, free_blocks = 10, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run2 = req.queue running {id = [1, 2, 3], prompt = [10, 40, 10], computed = [10, 0, 12], total = [11, 40, 13], max_tokens = [32, 32, 32], priority = [0, 0, 0], arrival = [1, 2, 3], status = [running, running, running], blocks = [1, 0, 1]}
}

// CHECK-LABEL:  sched.step 2
// CHECK-NEXT:     %run2 = req.queue running
// CHUNK-NEXT:     %[[M2:[0-9]+]] = req.schedule %run2 mixed {id = [1, 2], tokens = [1, 19]}
// CHUNK-NEXT:     mem.alloc %[[M2]] {id = [2], blocks = [2]}
// CHUNK-NEXT:     req.defer %run2 {id = [3], reason = [budget]}
// CHUNK-NEXT:     sched.yield %[[M2]]
// NOCHUNK-NEXT:   %[[D2:[0-9]+]] = req.schedule %run2 decode {id = [1, 3], tokens = [1, 1]}
// NOCHUNK-NEXT:   req.defer %run2 {id = [2], reason = [budget]}
// NOCHUNK-NEXT:   sched.yield %[[D2]]
// CHECK-NEXT:   }

// max_seqs = 2: the third request is deferred for max_seqs. The fourth has no
// budget left either, but max_seqs is the reason given.
sched.step 3 {token_budget = 2, max_seqs = 2, block_size = 16, free_blocks = 10, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run3 = req.queue running {id = [7, 8, 9, 10], prompt = [10, 10, 10, 10], computed = [10, 10, 10, 10], total = [11, 11, 11, 11], max_tokens = [32, 32, 32, 32], priority = [0, 0, 0, 0], arrival = [1, 2, 3, 4], status = [running, running, running, running], blocks = [1, 1, 1, 1]}
}

// CHECK-LABEL:  sched.step 3
// CHECK-NEXT:     %run3 = req.queue running
// CHECK-NEXT:     %[[D3:[0-9]+]] = req.schedule %run3 decode {id = [7, 8], tokens = [1, 1]}
// CHECK-NEXT:     req.defer %run3 {id = [9, 10], reason = [max_seqs, max_seqs]}
// CHECK-NEXT:     sched.yield %[[D3]]

// Decisions already in the step count: 6 of 16 tokens and 1 of 4 sequences are
// taken, request 4 was preempted (its 3 blocks freed; the pending set is the
// req.select without it), and 1 block was already allocated, so 0 + 3 - 1 = 2
// blocks are free. Requests 1, 2 and 3 each need a new block: 1 and 2 get
// them, 3 is deferred for memory; preempt: nobody is behind 3 in its set, and
// this pass preempted no one, so 3 is its own victim.
sched.step 4 {token_budget = 16, max_seqs = 4, block_size = 16, free_blocks = 0, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run4 = req.queue running {id = [1, 2, 3, 4], prompt = [16, 16, 16, 16], computed = [16, 16, 16, 40], total = [17, 17, 17, 41], max_tokens = [32, 32, 32, 32], priority = [0, 0, 0, 0], arrival = [1, 2, 3, 4], status = [running, running, running, running], blocks = [1, 1, 1, 3]}
  %w4 = req.queue waiting {id = [20], prompt = [6], computed = [0], total = [6], max_tokens = [8], priority = [0], arrival = [5], status = [waiting], blocks = [0]}
  %p4 = req.preempt %run4 recompute {id = [4]}
  mem.free %p4 {id = [4], blocks = [3]}
  %k4 = req.select %run4 {id = [1, 2, 3]}
  %a4 = req.schedule %w4 prefill {id = [20], tokens = [6]}
  mem.alloc %a4 {id = [20], blocks = [1]}
  sched.yield %a4
}

// CHECK-LABEL:  sched.step 4
// CHECK:          mem.alloc %a4 {id = [20], blocks = [1]}
// CHECK-NEXT:     %[[D4:[0-9]+]] = req.schedule %k4 decode {id = [1, 2], tokens = [1, 1]}
// CHECK-NEXT:     mem.alloc %[[D4]] {id = [1, 2], blocks = [1, 1]}
// NOPREEMPT-NEXT: req.defer %k4 {id = [3], reason = [memory]}
// PREEMPT-NEXT:   %{{[0-9]+}} = req.preempt %k4 recompute {id = [3]}
// CHECK-NEXT:     sched.yield %a4, %[[D4]]
// CHECK-NEXT:   }

// Nothing left to run: every request is in flight, so no req.schedule at all.
// An empty running queue gets no op.
sched.step 5 {token_budget = 8, max_seqs = 3, block_size = 16, free_blocks = 0, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run5 = req.queue running {id = [1, 2], prompt = [16, 16], computed = [17, 16], total = [17, 16], max_tokens = [32, 32], priority = [0, 0], arrival = [1, 2], status = [running, running], blocks = [2, 1]}
}
sched.step 6 {token_budget = 8, max_seqs = 3, block_size = 16, free_blocks = 0, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %e6 = req.queue running {id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = []}
}

// CHECK-LABEL:  sched.step 5
// CHECK-NEXT:     %run5 = req.queue running
// CHECK-NEXT:     req.defer %run5 {id = [1, 2], reason = [in_flight, in_flight]}
// CHECK-NEXT:     sched.yield
// CHECK-NEXT:   }
// CHECK-LABEL:  sched.step 6
// CHECK-NEXT:     %e6 = req.queue running
// CHECK-NEXT:     sched.yield
// CHECK-NEXT:   }

// A prefill chunk in flight (the runtime's `in_flight` column counts steps
// scheduled and not yet updated): request 1 still has 40 prompt tokens to go,
// but its previous chunk has not come back, so it is deferred in_flight rather
// than scheduled twice; request 2 runs. Without the column, nothing is in flight.
sched.step 7 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run7 = req.queue running {id = [1, 2], prompt = [80, 16], computed = [40, 17], total = [80, 18], max_tokens = [8, 8], priority = [0, 0], arrival = [1, 2], status = [running, running], blocks = [3, 2], in_flight = [1, 0]}
}

// CHECK-LABEL:  sched.step 7
// CHECK-NEXT:     %run7 = req.queue running
// CHECK-NEXT:     %[[S7:[0-9]+]] = req.schedule %run7 decode {id = [2], tokens = [1]}
// CHECK-NEXT:     req.defer %run7 {id = [1], reason = [in_flight]}
// CHECK-NEXT:     sched.yield %[[S7]]
// CHECK-NEXT:   }

// Priority victims (policy = "priority"), 1 free block of 16; every request
// needs a new block. 1 takes the free one. 2 preempts the largest (priority,
// arrival) behind it: 3 (priority 3), not 4, the last (FCFS would take 4),
// and waits (memory). 4 finds nobody behind it, but this pass already
// preempted 3 (its blocks come free next step), so 4 waits (memory) rather
// than preempting itself. preempt=false: 2, 3 and 4 wait (memory).
sched.step 8 {token_budget = 64, max_seqs = 8, block_size = 16, free_blocks = 1, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024, policy = "priority", facts = []} {
  %run8 = req.queue running {id = [1, 2, 3, 4], prompt = [16, 16, 16, 16], computed = [16, 16, 32, 16], total = [17, 17, 33, 17], max_tokens = [8, 8, 8, 8], priority = [0, 0, 3, 1], arrival = [1, 2, 3, 4], status = [running, running, running, running], blocks = [1, 1, 2, 1]}
}

// CHECK-LABEL:    sched.step 8
// CHECK-NEXT:     %run8 = req.queue running
// CHECK-NEXT:     %[[S8:[0-9]+]] = req.schedule %run8 decode {id = [1], tokens = [1]}
// CHECK-NEXT:     mem.alloc %[[S8]] {id = [1], blocks = [1]}
// PREEMPT-NEXT:   %{{[0-9]+}} = req.preempt %run8 recompute {id = [3]}
// PREEMPT-NEXT:   req.defer %run8 {id = [2, 4], reason = [memory, memory]}
// NOPREEMPT-NEXT: req.defer %run8 {id = [2, 3, 4], reason = [memory, memory, memory]}
// CHECK-NEXT:     sched.yield %[[S8]]
