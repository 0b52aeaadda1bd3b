// RUN: schedir opt %s -p vtc-order | filecheck %s
// RUN: schedir opt %s -p "reject-oversized,vtc-order,schedule-running,admit-greedy,vtc-account" | filecheck %s --check-prefix=ACCOUNT
// RUN: schedir opt %s --generic | schedir opt - -p vtc-order | filecheck %s

// VTC (OSDI '24): tenant 1 has been served 500 weighted tokens, tenant 2 none, tenant 3 (now
// running) 300. Tenant 2 comes back below the least served running tenant: its counter is lifted
// to 300. Admission order: tenant 2's first request (counter 300, then 300 + 100 = 400), then
// tenant 2's second (400 < 500; then 450), then tenant 1's (500).

sched.step 2 {token_budget = 1000, max_seqs = 8, block_size = 16, free_blocks = 100, cached_free_blocks = 0, total_blocks = 200, max_model_len = 4096, policy = "fcfs", facts = ["admissible"]} {
  sched.state {vtc_counter = [0.0, 500.0, 0.0, 300.0]}
  %run = req.queue running {id = [9], prompt = [10], computed = [11], total = [12], max_tokens = [8], priority = [0], arrival = [1], status = [running], blocks = [1], tenant = [3]}
  %w = req.queue waiting {id = [4, 5, 6], prompt = [20, 100, 50], computed = [0, 0, 0], total = [20, 100, 50], max_tokens = [8, 8, 8], priority = [0, 0, 0], arrival = [2, 3, 4], status = [waiting, waiting, waiting], blocks = [0, 0, 0], tenant = [1, 2, 2]}
}

// CHECK:      sched.set_state {vtc_counter = [0.0, 500.0, 300.0, 300.0]}
// CHECK-NEXT: req.sort %w by ["vtc-counter", "arrival"] {id = [5, 6, 4]}

// ACCOUNT: sched.set_state {vtc_counter = [0.0, 520.0, 450.0, 302.0]}
