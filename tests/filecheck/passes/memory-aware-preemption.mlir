// RUN: schedir opt %s -p order-fcfs,memory-aware-preemption | filecheck %s
// RUN: schedir opt %s -p "order-fcfs,memory-aware-preemption{victim=least-progress}" | filecheck %s --check-prefix=PROGRESS
// RUN: schedir opt %s -p "order-fcfs,memory-aware-preemption{victim=lru}" | filecheck %s --check-prefix=LRU

// Step 1: 2 free blocks (block_size 16). Waiting 10 (priority 0) needs 4 blocks: short by 2.
// Running decodes (all at a block boundary minus one: no growth):
//   id          1    2    3    4
//   priority    0    5    3    5
//   blocks      2    1    1    1
//   generated   8   12    2    9     (computed - prompt)
//   last run    -    2    7    5     (map_last_run; map_seen_computed = computed: none ran since)
//   arrival     1    2    3    4
// Victims must be less urgent than 10 (not 1). Two blocks are needed, one per victim:
//   lowest-priority: 4, 2 (priority 5, newest first); least-progress: 3 (2), 4 (9);
//   lru: 2 (step 2), 4 (step 5).
sched.step 9 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 2, cached_free_blocks = 0, total_blocks = 10, max_model_len = 1000, policy = "priority", facts = []} {
  %r1 = req.queue running {id = [1, 2, 3, 4], prompt = [20, 3, 12, 6], computed = [28, 15, 14, 15], total = [28, 15, 14, 15], max_tokens = [32, 32, 32, 32], priority = [0, 5, 3, 5], arrival = [1, 2, 3, 4], status = [running, running, running, running], blocks = [2, 1, 1, 1], map_seen_computed = [28, 15, 14, 15], map_last_run = [8, 2, 7, 5]}
  %w1 = req.queue waiting {id = [10], prompt = [60], computed = [0], total = [60], max_tokens = [8], priority = [0], arrival = [9], status = [waiting], blocks = [0], map_seen_computed = [-1], map_last_run = [-1]}
}

// CHECK-LABEL:  sched.step 9
// CHECK:          req.set_state %r1 {id = [1, 2, 3, 4], map_seen_computed = [28, 15, 14, 15], map_last_run = [8, 2, 7, 5]}
// CHECK-NEXT:     %{{[0-9]+}} = req.preempt %r1 recompute {id = [4, 2]}
// CHECK-NEXT:     req.set_state %r1 {id = [4, 2], map_seen_computed = [-1, -1]}
// CHECK-NEXT:     %{{[0-9]+}} = req.select %r1 {id = [1, 3]}

// PROGRESS:       req.preempt %r1 recompute {id = [3, 4]}
// LRU:            req.preempt %r1 recompute {id = [2, 4]}

// Step 2: 4 free blocks: the prefill fits, nobody is preempted; request 2 ran (computed grew
// past map_seen_computed), so its last run becomes step 9 (the one before).
sched.step 10 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 4, cached_free_blocks = 0, total_blocks = 10, max_model_len = 1000, policy = "priority", facts = []} {
  %r2 = req.queue running {id = [2], prompt = [3], computed = [16], total = [16], max_tokens = [32], priority = [5], arrival = [2], status = [running], blocks = [1], map_seen_computed = [15], map_last_run = [2]}
  %w2 = req.queue waiting {id = [10], prompt = [60], computed = [0], total = [60], max_tokens = [8], priority = [0], arrival = [9], status = [waiting], blocks = [0], map_seen_computed = [-1], map_last_run = [-1]}
}

// CHECK-LABEL:  sched.step 10
// CHECK:          req.set_state %r2 {id = [2], map_seen_computed = [16], map_last_run = [9]}
// CHECK-NOT:      req.preempt
// CHECK:          sched.yield
