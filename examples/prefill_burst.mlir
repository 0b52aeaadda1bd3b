// prefill_burst: a burst of 12 new prompts (33 to 4000 tokens) arrives while 3
// requests decode. Five prompts share a cached prefix (mem.match): their hit
// blocks are shared instead of recomputed, and those that sat in the free
// queue (cached_free) are revived, costing free blocks. The 2048-token budget
// cannot hold the burst: after the decodes, admit-greedy walks the prompts in
// arrival order, takes what fits and defers the rest for budget (the walk goes
// on past a prompt that does not fit, so short prompts behind it still run).
//
//   schedir opt examples/prefill_burst.mlir -p base
sched.step 77 {token_budget = 2048, max_seqs = 64, block_size = 16, free_blocks = 600, cached_free_blocks = 40, total_blocks = 2048, max_model_len = 8192, policy = "fcfs", facts = []} {
  %run = req.queue running {
      id = [1, 2, 3],
      prompt = [300, 120, 64],
      computed = [339, 126, 128],
      total = [340, 127, 129],
      max_tokens = [256, 256, 256],
      priority = [0, 0, 0],
      arrival = [100, 110, 120],
      status = [running, running, running],
      blocks = [22, 8, 8]}
  %w = req.queue waiting {
      id = [200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211],
      prompt = [2048, 512, 96, 700, 1500, 33, 256, 4000, 128, 900, 64, 350],
      computed = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
      total = [2048, 512, 96, 700, 1500, 33, 256, 4000, 128, 900, 64, 350],
      max_tokens = [256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256],
      priority = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
      arrival = [5000, 5005, 5010, 5015, 5020, 5025, 5030, 5035, 5040, 5045, 5050, 5055],
      status = [waiting, waiting, waiting, waiting, waiting, waiting, waiting, waiting, waiting, waiting, waiting, waiting],
      blocks = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]}
  mem.match %w {id = [201, 204, 205, 208, 211], hit = [256, 1024, 32, 128, 160], cached_free = [4, 0, 2, 8, 0]}
}
