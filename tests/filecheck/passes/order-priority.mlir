// RUN: schedir opt %s -p order-priority | filecheck %s
// RUN: schedir opt %s -p reject-oversized,order-priority | filecheck %s --check-prefix=AFTER-REJECT
// RUN: schedir opt %s -p "order-priority{queue=running}" | filecheck %s --check-prefix=RUNNING

// order-priority sorts the pending set of a queue (`waiting` by default) by
// priority, lower value first (negative values are more urgent still), then by
// arrival; requests equal on both keep queue order (a stable sort).

//   id        10  11  12  13  14   15  16
//   priority   1   0   1   0   0   -2   1
//   arrival   30  40  20  40  10   50  20
// -> 15 (-2); then priority 0 by arrival: 14 (10), 11 and 13 (40, queue order);
//    then priority 1: 12 and 16 (20, queue order), 10 (30).
// Request 14 is too long (max_model_len = 100).
sched.step 1 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 20, cached_free_blocks = 0, total_blocks = 20, max_model_len = 100, policy = "priority", facts = []} {
  %run1 = req.queue running {id = [1, 2, 3], prompt = [10, 10, 10], computed = [10, 10, 10], total = [11, 11, 11], max_tokens = [32, 32, 32], priority = [1, 0, 0], arrival = [1, 9, 3], status = [running, running, running], blocks = [1, 1, 1]}
  %w1 = req.queue waiting {id = [10, 11, 12, 13, 14, 15, 16], prompt = [10, 10, 10, 10, 200, 10, 10], computed = [0, 0, 0, 0, 0, 0, 0], total = [10, 10, 10, 10, 200, 10, 10], max_tokens = [8, 8, 8, 8, 8, 8, 8], priority = [1, 0, 1, 0, 0, -2, 1], arrival = [30, 40, 20, 40, 10, 50, 20], status = [waiting, waiting, waiting, waiting, waiting, waiting, waiting], blocks = [0, 0, 0, 0, 0, 0, 0]}
}

// CHECK-LABEL:  sched.step 1
// CHECK-SAME:     facts = ["order"]
// CHECK:          %{{[0-9]+}} = req.sort %w1 by ["priority", "arrival"] {id = [15, 14, 11, 13, 12, 16, 10]}
// CHECK-NEXT:     sched.yield
// CHECK-NEXT:   }

// AFTER-REJECT-LABEL: sched.step 1
// AFTER-REJECT:         req.reject %w1 {id = [14], reason = [too_long]}
// AFTER-REJECT-NEXT:    %[[K:[0-9]+]] = req.select %w1 {id = [10, 11, 12, 13, 15, 16]}
// AFTER-REJECT-NEXT:    %{{[0-9]+}} = req.sort %[[K]] by ["priority", "arrival"] {id = [15, 11, 13, 12, 16, 10]}
// AFTER-REJECT-NEXT:    sched.yield

// RUNNING-LABEL: sched.step 1
// RUNNING:         %{{[0-9]+}} = req.sort %run1 by ["priority", "arrival"] {id = [3, 2, 1]}
// RUNNING-NEXT:    sched.yield

// A sort already in the input is the pending set: it is sorted again.
sched.step 2 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 20, cached_free_blocks = 0, total_blocks = 20, max_model_len = 100, policy = "priority", facts = []} {
  %w2 = req.queue waiting {id = [20, 21], prompt = [10, 10], computed = [0, 0], total = [10, 10], max_tokens = [8, 8], priority = [5, 4], arrival = [1, 2], status = [waiting, waiting], blocks = [0, 0]}
  %s2 = req.sort %w2 by ["arrival"] {id = [20, 21]}
}

// CHECK-LABEL:  sched.step 2
// CHECK-NEXT:     %w2 = req.queue waiting
// CHECK-NEXT:     %s2 = req.sort %w2 by ["arrival"] {id = [20, 21]}
// CHECK-NEXT:     %{{[0-9]+}} = req.sort %s2 by ["priority", "arrival"] {id = [21, 20]}
// CHECK-NEXT:     sched.yield
