// out_of_blocks: the KV cache is nearly full (3 free blocks of 256). Eight
// requests decode; five of them (1, 3, 4, 6, 8) have filled their last block,
// so their next token needs a new one. Requests 1, 3 and 4 get the last free
// blocks. Request 6 finds none left, so schedule-running preempts (recompute)
// the request last in order, 8, as vLLM does; it counts the victim's blocks
// free only from the next step (the lowering frees them), so 6 is deferred for
// memory this step. 2, 5 and 7, with room left in their last block, still
// decode. The waiting prompts all need blocks too, and none are left: every
// one is deferred for memory, although the token budget has plenty of room.
//
//   schedir opt examples/out_of_blocks.mlir -p base
//
// (tests/test_examples.py checks the CHECK lines below against that command.)
sched.step 5031 {token_budget = 1024, max_seqs = 64, block_size = 16, free_blocks = 3, cached_free_blocks = 0, total_blocks = 256, max_model_len = 4096, policy = "fcfs", facts = []} {
  %run = req.queue running {
      id = [1, 2, 3, 4, 5, 6, 7, 8],
      prompt = [100, 64, 200, 31, 128, 90, 47, 500],
      computed = [112, 83, 208, 48, 154, 96, 76, 512],
      total = [113, 84, 209, 49, 155, 97, 77, 513],
      max_tokens = [256, 256, 256, 256, 256, 256, 256, 256],
      priority = [0, 0, 0, 0, 0, 0, 0, 0],
      arrival = [300, 301, 302, 303, 304, 305, 306, 307],
      status = [running, running, running, running, running, running, running, running],
      blocks = [7, 6, 13, 3, 10, 6, 5, 32]}
  %w = req.queue waiting {
      id = [50, 51, 52],
      prompt = [40, 8, 300],
      computed = [0, 0, 0],
      total = [40, 8, 300],
      max_tokens = [128, 128, 128],
      priority = [0, 0, 0],
      arrival = [900, 910, 920],
      status = [waiting, waiting, waiting],
      blocks = [0, 0, 0]}
}

// CHECK:      %[[DEC:[0-9]+]] = req.schedule %run decode {id = [1, 2, 3, 4, 5, 7], tokens = [1, 1, 1, 1, 1, 1]}
// CHECK-NEXT: mem.alloc %[[DEC]] {id = [1, 3, 4], blocks = [1, 1, 1]}
// CHECK-NEXT: req.preempt %run recompute {id = [8]}
// CHECK-NEXT: req.defer %run {id = [6], reason = [memory]}
// CHECK-NEXT: req.defer %{{[0-9]+}} {id = [50, 51, 52], reason = [memory, memory, memory]}
// CHECK-NEXT: sched.yield %[[DEC]]
