// RUN: schedir opt %s -p reject-oversized | filecheck %s
// RUN: schedir opt %s -p "reject-oversized{queue=running}" | filecheck %s --check-prefix=RUNNING
// RUN: schedir opt %s -p reject-oversized | schedir opt - | filecheck %s

// reject-oversized refuses the requests of a queue (`waiting` by default) that
// can never run: total >= max_model_len, no room for one new token (too_long,
// which wins when both hold; vLLM refuses such a prompt too) or a generation
// that outgrows the whole cache (exceeds_cache): the KV held at the last step,
// peak = max(total, min(prompt + max_tokens, max_model_len) - 1) tokens (the
// last sampled token is never computed), needs ceil(peak / block_size) >
// total_blocks. The rest stays pending as a req.select, in queue order.

// max_model_len = 1024; the cache holds 20 blocks of 16 = 320 tokens.
// (max_tokens 8 unless said)
//   10: 100 + 8 - 1 = 107 tokens                     -> kept
//   11: 1025 >= 1024                                 -> too_long
//   12: 321 tokens = 21 blocks > 20                  -> exceeds_cache
//   13: 2000: both                                   -> too_long
//   14: 320, max_tokens 1: 320 tokens = 20 blocks    -> kept (exactly the whole cache)
//   15: preempted, prompt 300 but total 330 (generated tokens count) -> exceeds_cache
//   16: 50 tokens                                    -> kept
//   17: 100, max_tokens 300: 399 tokens = 25 blocks  -> exceeds_cache (the prompt fits, the generation does not)
//   18: 100, max_tokens 221: 320 tokens = 20 blocks  -> kept
// The running request 1 is too long too, but only the waiting queue is checked.
sched.step 1 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 20, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run1 = req.queue running {id = [1], prompt = [2000], computed = [2000], total = [2001], max_tokens = [32], priority = [0], arrival = [1], status = [running], blocks = [0]}
  %w1 = req.queue waiting {id = [10, 11, 12, 13, 14, 15, 16, 17, 18], prompt = [100, 1025, 321, 2000, 320, 300, 50, 100, 100], computed = [0, 0, 0, 0, 0, 0, 0, 0, 0], total = [100, 1025, 321, 2000, 320, 330, 50, 100, 100], max_tokens = [8, 8, 8, 8, 1, 8, 8, 300, 221], priority = [0, 0, 0, 0, 0, 0, 0, 0, 0], arrival = [1, 2, 3, 4, 5, 6, 7, 8, 9], status = [waiting, waiting, waiting, waiting, waiting, preempted, waiting, waiting, waiting], blocks = [0, 0, 0, 0, 0, 0, 0, 0, 0]}
}

// CHECK-LABEL: sched.step 1
// CHECK-SAME:    facts = ["admissible"]
// CHECK-NEXT:    %run1 = req.queue running
// CHECK-NEXT:    %w1 = req.queue waiting
// CHECK-NEXT:    req.reject %w1 {id = [11, 12, 13, 15, 17], reason = [too_long, exceeds_cache, too_long, exceeds_cache, exceeds_cache]}
// CHECK-NEXT:    %{{[0-9]+}} = req.select %w1 {id = [10, 14, 16, 18]}
// CHECK-NEXT:    sched.yield
// CHECK-NEXT:  }

// RUNNING-LABEL: sched.step 1
// RUNNING-NEXT:    %run1 = req.queue running
// RUNNING-NEXT:    %w1 = req.queue waiting
// RUNNING-NEXT:    req.reject %run1 {id = [1], reason = [too_long]}
// RUNNING-NEXT:    %{{[0-9]+}} = req.select %run1 {id = []}
// RUNNING-NEXT:    sched.yield
// RUNNING-NEXT:  }

// Max model length and cache size at the limit: 64 tokens leave room for one
// more under max_model_len = 65, and fill 4 blocks of 16 exactly: whatever
// max_tokens says, the model length caps the generation at 64 tokens of KV.
// Every request fits exactly or less: nothing is emitted.
sched.step 2 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 4, cached_free_blocks = 0, total_blocks = 4, max_model_len = 65, policy = "fcfs", facts = []} {
  %w2 = req.queue waiting {id = [20, 21], prompt = [64, 1], computed = [0, 0], total = [64, 1], max_tokens = [8, 8], priority = [0, 0], arrival = [1, 2], status = [waiting, waiting], blocks = [0, 0]}
}

// CHECK-LABEL: sched.step 2
// CHECK-NEXT:    %w2 = req.queue waiting
// CHECK-NEXT:    sched.yield
// CHECK-NEXT:  }

// A prompt of exactly max_model_len cannot produce a token: too_long (vLLM's
// input processor refuses it; admitted and chunked it would stall one token
// short). One token less is kept, and so is a long generation: the model
// length (64, < 8 blocks of 16) caps it before the cache would.
sched.step 6 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 8, cached_free_blocks = 0, total_blocks = 8, max_model_len = 64, policy = "fcfs", facts = []} {
  %w6 = req.queue waiting {id = [60, 61, 62], prompt = [64, 63, 10], computed = [0, 0, 0], total = [64, 63, 10], max_tokens = [1, 1, 1000], priority = [0, 0, 0], arrival = [1, 2, 3], status = [waiting, waiting, waiting], blocks = [0, 0, 0]}
}

// CHECK-LABEL: sched.step 6
// CHECK-NEXT:    %w6 = req.queue waiting
// CHECK-NEXT:    req.reject %w6 {id = [60], reason = [too_long]}
// CHECK-NEXT:    %{{[0-9]+}} = req.select %w6 {id = [61, 62]}
// CHECK-NEXT:    sched.yield
// CHECK-NEXT:  }

// The cache is smaller than the model length: 65 tokens need 5 blocks of 16 > 4.
// A pending set that is already a req.select is the one decided on.
sched.step 3 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 4, cached_free_blocks = 0, total_blocks = 4, max_model_len = 4096, policy = "fcfs", facts = []} {
  %w3 = req.queue waiting {id = [30, 31, 32], prompt = [65, 64, 10], computed = [0, 0, 0], total = [65, 64, 10], max_tokens = [8, 1, 8], priority = [0, 0, 0], arrival = [1, 2, 3], status = [waiting, waiting, waiting], blocks = [0, 0, 0]}
  %k3 = req.select %w3 {id = [31, 30]}
  req.defer %w3 {id = [32], reason = [policy]}
}

// CHECK-LABEL: sched.step 3
// CHECK-NEXT:    %w3 = req.queue waiting
// CHECK-NEXT:    %k3 = req.select %w3 {id = [31, 30]}
// CHECK-NEXT:    req.defer %w3 {id = [32], reason = [policy]}
// CHECK-NEXT:    req.reject %k3 {id = [30], reason = [exceeds_cache]}
// CHECK-NEXT:    %{{[0-9]+}} = req.select %k3 {id = [31]}
// CHECK-NEXT:    sched.yield
// CHECK-NEXT:  }

// No waiting queue, or an empty one: nothing to do.
sched.step 4 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 4, cached_free_blocks = 0, total_blocks = 4, max_model_len = 16, policy = "fcfs", facts = []} {
  %w4 = req.queue waiting {id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = []}
}
sched.step 5 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 4, cached_free_blocks = 0, total_blocks = 4, max_model_len = 16, policy = "fcfs", facts = []} {
  %s5 = req.queue swapped {id = [50], prompt = [100], computed = [100], total = [101], max_tokens = [8], priority = [0], arrival = [1], status = [swapped], blocks = [0]}
}

// CHECK-LABEL: sched.step 4
// CHECK-NEXT:    %w4 = req.queue waiting {id = []
// CHECK-NEXT:    sched.yield
// CHECK-NEXT:  }
// CHECK-LABEL: sched.step 5
// CHECK-NEXT:    %s5 = req.queue swapped
// CHECK-NEXT:    sched.yield
// CHECK-NEXT:  }
