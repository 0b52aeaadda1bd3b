// RUN: not schedir opt %s -p verify-step --print-ir-after-all 2>&1 | filecheck %s --check-prefix=LEGAL
// RUN: not schedir opt %s -p verify-step 2>&1 | filecheck %s --check-prefix=ILLEGAL
// RUN: sh -c 'schedir opt %s -p verify-step > /dev/null 2>&1; echo "exit code $?"' | filecheck %s --check-prefix=EXIT
// RUN: not schedir opt %s -p "verify-step{complete=false}" 2>&1 | filecheck %s --check-prefix=INCOMPLETE

// verify-step checks that a step is legal and fails the pipeline (exit code 1)
// naming the step and every problem found, in this order: tokens over budget,
// requests over max_seqs, requests scheduled twice, blocks taken beyond the
// free blocks (+ those given back), evictions beyond the cached-free blocks;
// per req.schedule: more tokens than a request has left, fewer blocks held
// (+ allocated, shared, swapped in) than its tokens need; and, with complete
// (the default), every request of every queue has exactly one decision.

// A legal step (the base pipeline's decisions, written by hand): it passes, and
// the failure names step 2. More legal steps: verify-step-legal.mlir.
sched.step 1 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 1, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run1 = req.queue running {id = [1, 2], prompt = [10, 20], computed = [12, 21], total = [13, 22], max_tokens = [32, 32], priority = [0, 0], arrival = [5, 6], status = [running, running], blocks = [1, 2]}
  %w1 = req.queue waiting {id = [3, 4], prompt = [40, 50], computed = [0, 0], total = [40, 50], max_tokens = [8, 8], priority = [1, 0], arrival = [7, 8], status = [waiting, waiting], blocks = [0, 0]}
  mem.match %w1 {id = [3, 4], hit = [16, 0], cached_free = [1, 0]}
  %s1 = req.sort %w1 by ["arrival"] {id = [3, 4]}
  %d1 = req.schedule %run1 decode {id = [1, 2], tokens = [1, 1]}
  %a1 = req.schedule %s1 prefill {id = [3], tokens = [24]}
  mem.share %a1 {id = [3], blocks = [1], revived = [1]}
  mem.alloc %a1 {id = [3], blocks = [2]}
  req.defer %s1 {id = [4], reason = [budget]}
  mem.evict 1
  sched.yield %d1, %a1
}

// LEGAL:      IR after input
// LEGAL-NOT:  IR after verify-step
// LEGAL:      schedir: error: pass 'verify-step': step 2 is illegal

// Budget 10, max_seqs 2, 2 free blocks, 1 cached-free:
//   tokens 1 + 1 + 1 + 1 + 40 + 9 = 53 > 10; 6 requests > 2; request 2 twice;
//   3 blocks allocated > 2 free; 2 evicted > 1 cached-free;
//   request 1 reaches 17 tokens in its 1 block; request 11 gets 9 tokens of 8
//   and no block; request 2 has two decisions; request 12 none.
sched.step 2 {token_budget = 10, max_seqs = 2, block_size = 16, free_blocks = 2, cached_free_blocks = 1, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run2 = req.queue running {id = [1, 2, 3], prompt = [10, 5, 5], computed = [16, 5, 5], total = [17, 6, 6], max_tokens = [32, 32, 32], priority = [0, 0, 0], arrival = [1, 2, 3], status = [running, running, running], blocks = [1, 1, 1]}
  %w2 = req.queue waiting {id = [10, 11, 12], prompt = [40, 8, 8], computed = [0, 0, 0], total = [40, 8, 8], max_tokens = [8, 8, 8], priority = [0, 0, 0], arrival = [4, 5, 6], status = [waiting, waiting, waiting], blocks = [0, 0, 0]}
  %d2 = req.schedule %run2 decode {id = [1, 2, 3], tokens = [1, 1, 1]}
  %e2 = req.schedule %run2 decode {id = [2], tokens = [1]}
  %a2 = req.schedule %w2 prefill {id = [10], tokens = [40]}
  mem.alloc %a2 {id = [10], blocks = [3]}
  %b2 = req.schedule %w2 prefill {id = [11], tokens = [9]}
  mem.evict 2
  sched.yield %d2, %e2, %a2, %b2
}

// ILLEGAL:      schedir: error: pass 'verify-step': step 2 is illegal:
// ILLEGAL-SAME: 53 tokens scheduled, token budget is 10;
// ILLEGAL-SAME: 6 requests scheduled, max_seqs is 2;
// ILLEGAL-SAME: request(s) [2] scheduled more than once;
// ILLEGAL-SAME: 3 blocks taken, but only 2 free + 0 given back this step;
// ILLEGAL-SAME: 2 blocks evicted, only 1 cached-free;
// ILLEGAL-SAME: request(s) [11] scheduled more tokens than they have left to compute;
// ILLEGAL-SAME: request(s) [1, 11] hold too few blocks for the tokens scheduled;
// ILLEGAL-SAME: request(s) [2] of queue 'running' have more than one decision;
// ILLEGAL-SAME: request(s) [12] of queue 'waiting' have no decision (schedule, defer, reject or preempt){{$}}
// ILLEGAL-NOT:  Traceback

// EXIT: exit code 1

// Without complete, the decision checks are left out; the rest still fail.
// INCOMPLETE:      step 2 is illegal: 53 tokens scheduled
// INCOMPLETE-SAME: request(s) [1, 11] hold too few blocks for the tokens scheduled{{$}}
