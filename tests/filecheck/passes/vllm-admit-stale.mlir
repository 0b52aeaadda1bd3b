// RUN: schedir opt %s -p order-vllm,vllm-schedule-running,vllm-admit | filecheck %s

// A preempted request whose outputs from before the preemption are still in flight
// (`stale = [1, 0]`: they will be delivered) is skipped, not stopped at: resuming it
// now could recompute a position that output later fills (vLLM's rule, sync steps in
// flight and async scheduling alike). Request 0 is first in the queue (preempted
// requests go back to the front) and waits with reason in_flight; request 1 behind
// it is admitted.

builtin.module {
  sched.step 7 {token_budget = 16, max_seqs = 256, block_size = 4, free_blocks = 11, cached_free_blocks = 0, total_blocks = 11, max_model_len = 64, policy = "fcfs", facts = ["kv-pool"]} {
    mem.pool {blocks = [12], block_size = [4], caching = [0], width = [17], free = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], cached = [], cached_hash = [], rows = [0, 1], row_blocks = [0, 0], row_cached = [0, 0], row_hashes = [0, 0], table = [], hash = []}
    %running = req.queue running {id = [], prompt = [], computed = [], total = [], max_tokens = [], priority = [], arrival = [], status = [], blocks = [], in_flight = [], queued = [], rank = [], placeholders = [], stale = []}
    %waiting = req.queue waiting {id = [0, 1], prompt = [6, 5], computed = [0, 0], total = [8, 5], max_tokens = [8, 8], priority = [0, 0], arrival = [0, 1000000], status = [preempted, waiting], blocks = [0, 0], in_flight = [1, 0], queued = [-1, 1], rank = [0, 0], placeholders = [0, 0], stale = [1, 0]}
    sched.yield
  }
}

// CHECK:      %[[W:.*]] = req.sort %waiting by ["queued"] {id = [0, 1]}
// CHECK-NEXT: mem.match %[[W]] {id = [1], hit = [0]}
// CHECK-NEXT: %[[A:.*]] = req.schedule %[[W]] prefill {id = [1], tokens = [5]}
// CHECK-NEXT: mem.alloc %[[A]] {id = [1], blocks = [2]}
// CHECK-NEXT: req.defer %[[W]] {id = [0], reason = [in_flight]}
// CHECK-NEXT: sched.yield %[[A]]
