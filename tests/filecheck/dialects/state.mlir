// RUN: schedir opt %s | schedir opt - | filecheck %s
// RUN: schedir opt %s --generic | schedir opt - | filecheck %s

// Pass-declared state (schedir.ir.state): scheduler-level values in sched.state, new ones in
// sched.set_state; request state as extra req.queue columns, new values in req.set_state.

sched.step 4 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  sched.state {new_token_ratio = 0.7, vtc_scale = 2}
  %w = req.queue waiting {id = [3, 4], prompt = [40, 50], computed = [0, 0], total = [40, 50], max_tokens = [8, 8], priority = [0, 0], arrival = [7, 8], status = [waiting, waiting], blocks = [0, 0], level = [0, 2], attained = [0, 96]}
  %a = req.schedule %w prefill {id = [3], tokens = [40]}
  req.set_state %w {id = [3], level = [1], attained = [40]}
  sched.set_state {new_token_ratio = 0.6986}
  req.defer %w {id = [4], reason = [budget]}
  sched.yield %a
}

// CHECK:      sched.state {new_token_ratio = 0.7, vtc_scale = 2.0}
// CHECK-NEXT: %w = req.queue waiting {{{.*}}, level = [0, 2], attained = [0, 96]}
// CHECK-NEXT: %a = req.schedule %w prefill {id = [3], tokens = [40]}
// CHECK-NEXT: req.set_state %w {id = [3], level = [1], attained = [40]}
// CHECK-NEXT: sched.set_state {new_token_ratio = 0.6986}
// CHECK-NEXT: req.defer %w {id = [4], reason = [budget]}
// CHECK-NEXT: sched.yield %a
