// RUN: schedir opt %s -p order-fcfs,schedule-running,orca-admit | filecheck %s
// RUN: schedir opt %s -p orca | filecheck %s --check-prefix=PRESET

// orca-admit is Orca's admission (OSDI '22, Algorithm 1): each admitted request reserves the
// KV of its longest sequence, prompt + max_tokens. The running request (10 + 22 tokens, 8
// blocks of 4) holds 3 blocks, so 5 of the 12 free blocks are reserved for it and 7 are
// unreserved. Request 11 (6 + 10 tokens: 4 blocks) is admitted with its whole prompt (2
// blocks now); request 12 (8 + 20 tokens: 7 blocks) finds 3 unreserved blocks and stops
// admission (memory), so request 13 behind it waits (blocked) although it would fit.

sched.step 9 {token_budget = 64, max_seqs = 8, block_size = 4, free_blocks = 12, cached_free_blocks = 0, total_blocks = 16, max_model_len = 64, policy = "fcfs", facts = []} {
  %run = req.queue running {id = [1], prompt = [10], computed = [11], total = [12], max_tokens = [22], priority = [0], arrival = [100], status = [running], blocks = [3]}
  %w = req.queue waiting {id = [11, 12, 13], prompt = [6, 8, 2], computed = [0, 0, 0], total = [6, 8, 2], max_tokens = [10, 20, 2], priority = [0, 0, 0], arrival = [200, 300, 400], status = [waiting, waiting, waiting], blocks = [0, 0, 0]}
}

// CHECK:      %[[D:.*]] = req.schedule %run decode {id = [1], tokens = [1]}
// CHECK:      %[[A:.*]] = req.schedule %[[W:.*]] prefill {id = [11], tokens = [6]}
// CHECK-NEXT: mem.alloc %[[A]] {id = [11], blocks = [2]}
// CHECK-NEXT: req.defer %[[W]] {id = [12, 13], reason = [memory, blocked]}
// CHECK-NEXT: sched.yield %[[D]], %[[A]]

// PRESET: req.schedule %{{.*}} prefill {id = [11], tokens = [6]}
// PRESET: req.defer %{{.*}} {id = [12, 13], reason = [memory, blocked]}
