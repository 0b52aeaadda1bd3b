// decode_heavy: a steady-state decode step. 24 requests are decoding (one of
// them in flight: its last token has not come back yet, so it is deferred);
// every fourth sits at a block boundary, so its next token needs a fresh KV
// block. Two prompts are waiting: the decodes take 23 of the 512-token budget,
// the 180-token prompt fits, the 900-token prompt exceeds what is left and is
// deferred for budget.
//
//   schedir opt examples/decode_heavy.mlir -p base
sched.step 1200 {token_budget = 512, max_seqs = 32, block_size = 16, free_blocks = 40, cached_free_blocks = 4, total_blocks = 1024, max_model_len = 4096, policy = "fcfs", facts = []} {
  %run = req.queue running {
      id = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24],
      prompt = [300, 512, 64, 100, 64, 200, 100, 512, 200, 512, 100, 64, 512, 200, 128, 512, 100, 256, 128, 200, 100, 100, 64, 200],
      computed = [320, 595, 73, 146, 192, 204, 155, 520, 224, 519, 128, 137, 528, 205, 165, 530, 176, 327, 141, 247, 176, 172, 143, 264],
      total = [321, 596, 74, 147, 193, 205, 156, 521, 225, 520, 129, 138, 529, 206, 166, 531, 177, 328, 142, 248, 177, 173, 144, 264],
      max_tokens = [256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256],
      priority = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
      arrival = [1000, 1010, 1020, 1030, 1040, 1050, 1060, 1070, 1080, 1090, 1100, 1110, 1120, 1130, 1140, 1150, 1160, 1170, 1180, 1190, 1200, 1210, 1220, 1230],
      status = [running, running, running, running, running, running, running, running, running, running, running, running, running, running, running, running, running, running, running, running, running, running, running, running],
      blocks = [20, 38, 5, 10, 12, 13, 10, 33, 14, 33, 8, 9, 33, 13, 11, 34, 11, 21, 9, 16, 11, 11, 9, 17]}
  %w = req.queue waiting {
      id = [101, 102],
      prompt = [180, 900],
      computed = [0, 0],
      total = [180, 900],
      max_tokens = [128, 512],
      priority = [0, 0],
      arrival = [2000, 2010],
      status = [waiting, waiting],
      blocks = [0, 0]}
}
