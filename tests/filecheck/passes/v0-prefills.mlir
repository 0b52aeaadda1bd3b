// RUN: schedir opt %s -p "order-vllm,v0-prefills,v0-running,v0-swapped" | filecheck %s
// RUN: schedir opt %s -p "order-vllm,v0-prefills{delay-factor=3.0},v0-running,v0-swapped" | filecheck %s --check-prefix=DELAY

// vLLM v0's prompt step (v0-prefills, chunked prefill off): whole prompts in waiting order.
// Request 1 (70 tokens) is over the prompt limit min(max_model_len, budget) = 64 and request 3
// (40 tokens: 10 blocks) needs more than the 8-block pool minus its watermark (1% of 8: 0):
// both are ignored (v0's FINISHED_IGNORED) and the loop goes on. Request 2 prefills 6 tokens
// in 2 blocks; request 4 (5 blocks) finds 4 free and stops the loop. A step that admits a
// prompt decodes nothing (v0-running): request 0 waits for the next step.
//
// With delay-factor 3: the last step scheduled prompts (v0_prev_prompt = 1) at 5 s, so the
// last prompt latency is 6 - 5 = 1 s; the oldest waiting request arrived at 4 s, 2 s ago, not
// more than 3 x 1 s, and a request runs: v0's _passed_delay holds every prompt back.

builtin.module {
  sched.step 7 {token_budget = 64, max_seqs = 8, block_size = 4, free_blocks = 6, cached_free_blocks = 0, total_blocks = 8, max_model_len = 64, now_us = 6000000, policy = "fcfs", facts = ["kv-pool", "swapped-queue"]} {
    mem.pool {blocks = [9], block_size = [4], caching = [0], width = [17], free = [3, 4, 5, 6, 7, 8], cached = [], cached_hash = [], rows = [0], row_blocks = [2], row_cached = [0], row_hashes = [0], table = [1, 2], hash = [], host_blocks = [4], host_free = [3, 2, 1, 0], host_rows = [], host_row_blocks = [], host_table = []}
    sched.state {v0_prev_time_us = 5000000.0, v0_prev_prompt = 1.0, v0_last_prompt_latency_us = 0.0}
    %running = req.queue running {id = [0], prompt = [6], computed = [8], total = [9], max_tokens = [12], priority = [0], arrival = [0], status = [running], blocks = [2], in_flight = [0], queued = [0], rank = [0], placeholders = [0], stale = [0]}
    %waiting = req.queue waiting {id = [1, 2, 3, 4], prompt = [70, 6, 40, 20], computed = [0, 0, 0, 0], total = [70, 6, 40, 20], max_tokens = [8, 8, 8, 8], priority = [0, 0, 0, 0], arrival = [4000000, 4000000, 5000000, 5000000], status = [waiting, waiting, waiting, waiting], blocks = [0, 0, 0, 0], in_flight = [0, 0, 0, 0], queued = [1, 2, 3, 4], rank = [0, 0, 0, 0], placeholders = [0, 0, 0, 0], stale = [0, 0, 0, 0]}
    %swapped = req.queue swapped {id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = [], in_flight = [], queued = [], rank = [], placeholders = [], stale = []}
    sched.yield
  }
}

// CHECK:      sched.set_state {v0_prev_time_us = 6000000.0, v0_prev_prompt = 1.0, v0_last_prompt_latency_us = 1000000.0}
// CHECK-NEXT: req.reject %{{.*}} {id = [1, 3], reason = [too_long, exceeds_cache]}
// CHECK-NEXT: %[[P:.*]] = req.schedule %{{.*}} prefill {id = [2], tokens = [6]}
// CHECK-NEXT: mem.alloc %[[P]] {id = [2], blocks = [2]}
// CHECK-NEXT: req.defer %{{.*}} {id = [4], reason = [memory]}
// CHECK-NOT:  req.schedule %running

// DELAY:      sched.set_state {v0_prev_time_us = 6000000.0, v0_prev_prompt = 0.0, v0_last_prompt_latency_us = 1000000.0}
// DELAY-NEXT: req.defer %{{.*}} {id = [1, 2, 3, 4], reason = [policy, blocked, blocked, blocked]}
// DELAY-NEXT: %{{.*}} = req.schedule %running decode {id = [0], tokens = [1]}
