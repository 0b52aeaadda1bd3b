// RUN: schedir opt %s -p order-vllm,vllm-schedule-running,vllm-admit | filecheck %s
// RUN: schedir opt %s -p vllm | filecheck %s

// vllm-admit is vLLM 0.32's WAITING loop. Requests 0 and 1 share their first
// two blocks (8 tokens). Request 0 is admitted first and registers its full
// blocks at once, so request 1, looked up at its turn, hits them: 8 computed
// tokens, 2 shared blocks (not revived: they are held, not free), and it only
// needs its last 2 tokens. Request 2's 6-token prompt is chunked to the 5
// tokens of budget left (16 - 9 - 2).

builtin.module {
  sched.step 1 {token_budget = 16, max_seqs = 256, block_size = 4, free_blocks = 11, cached_free_blocks = 0, total_blocks = 11, max_model_len = 64, policy = "fcfs", facts = ["kv-pool"]} {
    mem.pool {blocks = [12], block_size = [4], caching = [1], width = [17], free = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], cached = [], cached_hash = [], rows = [0, 1, 2], row_blocks = [0, 0, 0], row_cached = [0, 0, 0], row_hashes = [2, 2, 1], table = [], hash = [4812885095571011673, -7533215935162412722, 4812885095571011673, -7533215935162412722, 4640950796963231581]}
    %running = req.queue running {id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = [], in_flight = [], queued = [], rank = []}
    %waiting = req.queue waiting {id = [0, 1, 2], prompt = [9, 10, 6], computed = [0, 0, 0], total = [9, 10, 6], max_tokens = [8, 8, 8], priority = [0, 0, 0], arrival = [0, 0, 1000000], status = [waiting, waiting, waiting], blocks = [0, 0, 0], in_flight = [0, 0, 0], queued = [0, 1, 2], rank = [0, 0, 0]}
    sched.yield
  }
}

// CHECK:      %[[W:.*]] = req.sort %waiting by ["queued"] {id = [0, 1, 2]}
// CHECK-NEXT: mem.match %[[W]] {id = [0, 1, 2], hit = [0, 8, 0]}
// CHECK-NEXT: %[[A:.*]] = req.schedule %[[W]] prefill {id = [0, 1, 2], tokens = [9, 2, 5]}
// CHECK-NEXT: mem.share %[[A]] {id = [1], blocks = [2], revived = [0]}
// CHECK-NEXT: mem.alloc %[[A]] {id = [0, 1, 2], blocks = [3, 1, 2]}
// CHECK-NEXT: sched.yield %[[A]]
