// RUN: schedir opt %s -p order-fcfs | filecheck %s
// RUN: schedir opt %s -p reject-oversized,order-fcfs | filecheck %s --check-prefix=AFTER-REJECT
// RUN: schedir opt %s -p "order-fcfs{queue=running}" | filecheck %s --check-prefix=RUNNING

// order-fcfs sorts the pending set of a queue (`waiting` by default) by arrival,
// earliest first; equal arrivals keep their queue order (a stable sort). The
// sort names its key: req.sort ... by ["arrival"].

// Arrivals 30, 10, 20, 10, 5, 20: ties 11/13 and 12/15 keep queue order.
// Priority is ignored. Request 14 is too long (max_model_len = 100).
sched.step 1 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 20, cached_free_blocks = 0, total_blocks = 20, max_model_len = 100, policy = "fcfs", facts = []} {
  %run1 = req.queue running {id = [2, 1], prompt = [10, 10], computed = [10, 10], total = [11, 11], max_tokens = [32, 32], priority = [0, 0], arrival = [9, 3], status = [running, running], blocks = [1, 1]}
  %w1 = req.queue waiting {id = [10, 11, 12, 13, 14, 15], prompt = [10, 10, 10, 10, 200, 10], computed = [0, 0, 0, 0, 0, 0], total = [10, 10, 10, 10, 200, 10], max_tokens = [8, 8, 8, 8, 8, 8], priority = [0, 9, 0, 0, 0, -1], arrival = [30, 10, 20, 10, 5, 20], status = [waiting, waiting, waiting, waiting, waiting, waiting], blocks = [0, 0, 0, 0, 0, 0]}
}

// CHECK-LABEL:  sched.step 1
// CHECK-SAME:     facts = ["order"]
// CHECK:          %[[S1:[0-9]+]] = req.sort %w1 by ["arrival"] {id = [14, 11, 13, 12, 15, 10]}
// CHECK-NEXT:     sched.yield
// CHECK-NEXT:   }

// AFTER-REJECT-LABEL: sched.step 1
// AFTER-REJECT-SAME:    facts = ["admissible", "order"]
// AFTER-REJECT:         req.reject %w1 {id = [14], reason = [too_long]}
// AFTER-REJECT-NEXT:    %[[K:[0-9]+]] = req.select %w1 {id = [10, 11, 12, 13, 15]}
// AFTER-REJECT-NEXT:    %{{[0-9]+}} = req.sort %[[K]] by ["arrival"] {id = [11, 13, 12, 15, 10]}
// AFTER-REJECT-NEXT:    sched.yield

// RUNNING-LABEL: sched.step 1
// RUNNING:         %{{[0-9]+}} = req.sort %run1 by ["arrival"] {id = [1, 2]}
// RUNNING-NEXT:    sched.yield

// An empty queue is decided already (nothing to order): no sort, like a step without the queue.
sched.step 2 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 20, cached_free_blocks = 0, total_blocks = 20, max_model_len = 100, policy = "fcfs", facts = []} {
  %w2 = req.queue waiting {id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = []}
}
sched.step 3 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 20, cached_free_blocks = 0, total_blocks = 20, max_model_len = 100, policy = "fcfs", facts = []} {
  %run3 = req.queue running {id = [1], prompt = [10], computed = [10], total = [11], max_tokens = [32], priority = [0], arrival = [3], status = [running], blocks = [1]}
}

// CHECK-LABEL:  sched.step 2
// CHECK-NEXT:     %w2 = req.queue waiting
// CHECK-NEXT:     sched.yield
// CHECK-LABEL:  sched.step 3
// CHECK-NEXT:     %run3 = req.queue running
// CHECK-NEXT:     sched.yield
