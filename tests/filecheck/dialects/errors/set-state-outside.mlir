// RUN: not schedir opt %s 2>&1 | filecheck %s
// A write of pass-declared state that the step does not declare, or that is not a pass's to write.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  sched.state {new_token_ratio = 0.7}
  %w = req.queue waiting {id = [3, 4], prompt = [40, 50], computed = [0, 0], total = [40, 50], max_tokens = [8, 8], priority = [1, 0], arrival = [7, 8], status = [waiting, waiting], blocks = [0, 0], level = [0, 0]}
  req.set_state %w {id = [9], level = [1]}
}

// CHECK: schedir: error: {{.*}}set-state-outside.mlir:7:3: req.set_state: request(s) [9] are not in the operand set
// CHECK-NOT: Traceback
