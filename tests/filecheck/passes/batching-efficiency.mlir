// RUN: schedir opt %s -p batching-efficiency | filecheck %s
// RUN: schedir opt %s -p "batching-efficiency{spread=2000.0}" | filecheck %s --check-prefix=WIDE

// batching-efficiency groups remaining lengths (total - computed) geometrically: with the
// default spread 0.5, lengths in a group differ by at most 1.5x. Groups go in the order of
// their oldest member, members by arrival. Requests older than max_age_ms (2000 ms; now_us =
// 3,000,000, arrivals in µs) go first, FCFS, whatever their length.
//   id         10    11    12    13     14
//   remaining 100  1000   110   1050   5000
//   arrival   1.5s  1.6s  2.5s  1.7s   0.5s (aged)
// -> 14 (aged); 10, 12 (~100, led by 10 at 1.5s); 11, 13 (~1000, led by 11 at 1.6s).
// Groups are a fixed geometric grid (bucket = floor(log(len) / log(1 + spread))): a spread of
// 2000 puts 10..13 in one group, FCFS after the aged one.
sched.step 1 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 20, cached_free_blocks = 0, total_blocks = 20, max_model_len = 10000, policy = "fcfs", facts = [], now_us = 3000000} {
  %w1 = req.queue waiting {id = [10, 11, 12, 13, 14], prompt = [100, 1000, 110, 1050, 5000], computed = [0, 0, 0, 0, 0], total = [100, 1000, 110, 1050, 5000], max_tokens = [8, 8, 8, 8, 8], priority = [0, 0, 0, 0, 0], arrival = [1500000, 1600000, 2500000, 1700000, 500000], status = [waiting, waiting, waiting, waiting, waiting], blocks = [0, 0, 0, 0, 0]}
}

// CHECK:        req.sort %w1 by ["aged", "length_group", "arrival"] {id = [14, 10, 12, 11, 13]}
// CHECK-NEXT:   sched.yield

// WIDE:         req.sort %w1 by ["aged", "length_group", "arrival"] {id = [14, 10, 11, 13, 12]}
