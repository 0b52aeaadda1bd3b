// RUN: schedir opt %s -p order-slo | filecheck %s
// RUN: schedir opt %s -p "order-slo{hopeless=reject}" | filecheck %s --check-prefix=REJECT
// RUN: not schedir opt %s -p "order-slo{hopeless=drop}" 2>&1 | filecheck %s --check-prefix=BADOPT

// order-slo at now = 10 s, 20,000 prefill tokens/s (20 tokens/ms), TTFT target 2 s unless a
// request says otherwise. The running request still has 10,000 prompt tokens to prefill
// (500 ms of work ahead of everyone). In arrival order:
// - 11 arrived at 7 s: done at 10 s + (10,000 + 4,000)/20 ms = 10.7 s, 3.7 s after arrival: hopeless;
// - 12 arrived at 9.5 s: 10 s + (10,000 + 10,000)/20 ms = 11 s, 1.5 s: kept (work 20,000);
// - 13 arrived at 9.8 s with its own 1 s target: 10 s + (20,000 + 2,000)/20 ms = 11.1 s, 1.3 s: hopeless;
// - 14 arrived at 9.9 s: 10 s + (20,000 + 2,000)/20 ms = 11.1 s, 1.2 s: kept.
// Kept requests go first in arrival order, hopeless ones after them (or are rejected).

sched.step 3 {token_budget = 8192, max_seqs = 8, block_size = 16, free_blocks = 1000, cached_free_blocks = 0, total_blocks = 2000, max_model_len = 16384, now_us = 10000000, policy = "fcfs", facts = ["admissible"]} {
  %run = req.queue running {id = [1], prompt = [12000], computed = [2000], total = [12000], max_tokens = [8], priority = [0], arrival = [1000000], status = [running], blocks = [125]}
  %w = req.queue waiting {id = [14, 11, 12, 13], prompt = [2000, 4000, 10000, 2000], computed = [0, 0, 0, 0], total = [2000, 4000, 10000, 2000], max_tokens = [8, 8, 8, 8], priority = [0, 0, 0, 0], arrival = [9900000, 7000000, 9500000, 9800000], status = [waiting, waiting, waiting, waiting], blocks = [0, 0, 0, 0], ttft_slo_ms = [0, 0, 0, 1000]}
}

// CHECK: req.sort %w by ["ttft-feasible desc", "arrival"] {id = [12, 14, 11, 13]}

// REJECT:      req.reject %w {id = [11, 13], reason = [slo, slo]}
// REJECT-NEXT: req.select %w {id = [12, 14]}

// BADOPT: schedir: error: pass 'order-slo': bad option: hopeless must be one of last, reject, got 'drop'
