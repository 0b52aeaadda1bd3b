// RUN: schedir opt %s | schedir opt - | filecheck %s
// RUN: schedir opt %s --generic | schedir opt - | filecheck %s
// RUN: schedir opt %s --generic | filecheck %s --check-prefix=GENERIC

// The sched dialect: sched.step (every fact, a policy, analysis facts, extra
// attributes, an empty body) and sched.yield (implicit, empty, one and several
// operands). Several steps may share a module.

// An empty step: sched.yield is added.
sched.step 0 {token_budget = 1, max_seqs = 1, block_size = 1, free_blocks = 0, cached_free_blocks = 0, total_blocks = 0, max_model_len = 1, policy = "fcfs", facts = []} {
}

// Facts in any order; policy and facts may be left out.
sched.step 1 {max_model_len = 4096, total_blocks = 100, cached_free_blocks = 5, free_blocks = 50, block_size = 16, max_seqs = 8, token_budget = 512} {
  %run = req.queue running {id = [1], prompt = [10], computed = [10], total = [11], max_tokens = [32], priority = [0], arrival = [5], status = [running], blocks = [1]}
}

// Analysis facts are printed sorted; extra attributes on the step are kept.
sched.step 2 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024, policy = "priority", facts = ["running-scheduled", "order"]} attributes {engine = "cpu"} {
  %run = req.queue running {id = [1, 2], prompt = [10, 20], computed = [12, 21], total = [13, 22], max_tokens = [32, 32], priority = [0, 0], arrival = [5, 6], status = [running, running], blocks = [1, 2]}
  %w = req.queue waiting {id = [3], prompt = [40], computed = [0], total = [40], max_tokens = [8], priority = [1], arrival = [7], status = [waiting], blocks = [0]}
  %d = req.schedule %run decode {id = [1, 2], tokens = [1, 1]}
  %a = req.schedule %w prefill {id = [3], tokens = [40]}
  sched.yield %d, %a
}

// A single yielded set.
sched.step 3 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run = req.queue running {id = [1], prompt = [10], computed = [12], total = [13], max_tokens = [32], priority = [0], arrival = [5], status = [running], blocks = [1]}
  %d = req.schedule %run decode {id = [1], tokens = [1]}
  sched.yield %d
}

// CHECK:      builtin.module {
// CHECK-NEXT:   sched.step 0 {token_budget = 1, max_seqs = 1, block_size = 1, free_blocks = 0, cached_free_blocks = 0, total_blocks = 0, max_model_len = 1, policy = "fcfs", facts = []} {
// CHECK-NEXT:     sched.yield
// CHECK-NEXT:   }
// CHECK-NEXT:   sched.step 1 {token_budget = 512, max_seqs = 8, block_size = 16, free_blocks = 50, cached_free_blocks = 5, total_blocks = 100, max_model_len = 4096, policy = "fcfs", facts = []} {
// CHECK-NEXT:     %run = req.queue running {id = [1], prompt = [10], computed = [10], total = [11], max_tokens = [32], priority = [0], arrival = [5], status = [running], blocks = [1]}
// CHECK-NEXT:     sched.yield
// CHECK-NEXT:   }
// CHECK-NEXT:   sched.step 2 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024, policy = "priority", facts = ["order", "running-scheduled"]} attributes {engine = "cpu"} {
// CHECK-NEXT:     %[[RUN2:run[_0-9]*]] = req.queue running {id = [1, 2], {{.*}}}
// CHECK-NEXT:     %w = req.queue waiting {id = [3], {{.*}}}
// CHECK-NEXT:     %d = req.schedule %[[RUN2]] decode {id = [1, 2], tokens = [1, 1]}
// CHECK-NEXT:     %a = req.schedule %w prefill {id = [3], tokens = [40]}
// CHECK-NEXT:     sched.yield %d, %a
// CHECK-NEXT:   }
// CHECK-NEXT:   sched.step 3 {{.*}} {
// CHECK-NEXT:     %[[RUN3:run[_0-9]*]] = req.queue running {id = [1], {{.*}}}
// CHECK-NEXT:     %[[D3:d[_0-9]*]] = req.schedule %[[RUN3]] decode {id = [1], tokens = [1]}
// CHECK-NEXT:     sched.yield %[[D3]]
// CHECK-NEXT:   }
// CHECK-NEXT: }

// GENERIC:      "builtin.module"() ({
// GENERIC-NEXT:   "sched.step"() <{{{.*}}step = 0 : i64{{.*}}}> ({
// GENERIC-NEXT:     "sched.yield"() : () -> ()
// GENERIC-NEXT:   }) : () -> ()
// GENERIC:        "sched.step"() <{{{.*}}step = 2 : i64{{.*}}}> ({
// GENERIC:          "sched.yield"(%d, %a) : (!req.set, !req.set) -> ()
// GENERIC-NEXT:   }) {engine = "cpu"} : () -> ()
// GENERIC:          "sched.yield"(%{{d[_0-9]*}}) : (!req.set) -> ()
// GENERIC-NEXT:   }) : () -> ()
// GENERIC-NEXT: }) : () -> ()
