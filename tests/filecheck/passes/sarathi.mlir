// RUN: schedir opt %s -p "sarathi-budget{tbt-ms=10 step-us=2000 token-us=100},order-decodes-first" | filecheck %s
// RUN: not schedir opt %s -p "sarathi-budget{tbt-ms=2}" 2>&1 | filecheck %s --check-prefix=BAD

// Sarathi-Serve: a 10 ms TBT target with 2 ms per step and 100 µs per token leaves (10,000 -
// 2,000) / 100 = 80 tokens a step: the budget of 512 is lowered to 80. The running requests are
// ordered decodes first (2, 4: their prompts are computed), then the prefills in progress (1, 3),
// each group in queue order.

sched.step 7 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 100, cached_free_blocks = 0, total_blocks = 200, max_model_len = 4096, policy = "fcfs", facts = []} {
  %run = req.queue running {id = [1, 2, 3, 4], prompt = [400, 10, 300, 20], computed = [64, 12, 32, 25], total = [400, 13, 300, 26], max_tokens = [8, 8, 8, 8], priority = [0, 0, 0, 0], arrival = [1, 2, 3, 4], status = [running, running, running, running], blocks = [4, 1, 2, 2]}
}

// CHECK:      sched.step 7 {token_budget = 80, max_seqs = 8,
// CHECK:      req.sort %run by ["prefilling", "queue"] {id = [2, 4, 1, 3]}

// BAD: schedir: error: pass 'sarathi-budget': bad option: tbt-ms=2 leaves no room for a token after the step's fixed 8000 µs
