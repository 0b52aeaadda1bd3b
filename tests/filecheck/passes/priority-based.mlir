// RUN: schedir opt %s -p priority-based | filecheck %s
// RUN: schedir opt %s -p prefix-cache-aware,priority-based | filecheck %s --check-prefix=AFTER

// priority-based: lower priority value first, then arrival; stable, so after
// prefix-cache-aware the hit order breaks ties of equal priority and arrival.
//   id        10  11  12  13
//   priority   1   0   1   0
//   arrival    5   7   5   7
//   hit        0   0  32  32
sched.step 1 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 20, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1000, policy = "priority", facts = []} {
  %w1 = req.queue waiting {id = [10, 11, 12, 13], prompt = [40, 40, 40, 40], computed = [0, 0, 0, 0], total = [40, 40, 40, 40], max_tokens = [8, 8, 8, 8], priority = [1, 0, 1, 0], arrival = [5, 7, 5, 7], status = [waiting, waiting, waiting, waiting], blocks = [0, 0, 0, 0]}
  mem.match %w1 {id = [10, 11, 12, 13], hit = [0, 0, 32, 32], cached_free = [0, 0, 0, 0]}
}

// CHECK:        req.sort %w1 by ["priority", "arrival"] {id = [11, 13, 10, 12]}
// CHECK-NEXT:   sched.yield

// AFTER:        %[[S:[0-9]+]] = req.sort %w1 by ["prefix_hit desc", "arrival"] {id = [12, 13, 10, 11]}
// AFTER-NEXT:   req.sort %[[S]] by ["priority", "arrival"] {id = [13, 11, 12, 10]}
