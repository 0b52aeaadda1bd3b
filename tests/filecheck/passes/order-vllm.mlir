// RUN: schedir opt %s -p order-vllm | filecheck %s --check-prefix=FCFS
// RUN: sed -e 's/policy = "fcfs"/policy = "priority"/' %s | schedir opt - -p order-vllm | filecheck %s --check-prefix=PRIO

// order-vllm: FCFS is vLLM's deque (the `queued` position: a preempted request,
// put back at the front, has a smaller one than any arrival); priority is
// vLLM's heap: priority, then arrival, then request id (`rank`).

builtin.module {
  sched.step 1 {token_budget = 16, max_seqs = 8, block_size = 4, free_blocks = 8, cached_free_blocks = 0, total_blocks = 8, max_model_len = 64, policy = "fcfs", facts = []} {
    %w = req.queue waiting {id = [4, 5, 6, 7], prompt = [4, 4, 4, 4], computed = [0, 0, 0, 0], total = [4, 4, 4, 4], max_tokens = [1, 1, 1, 1], priority = [1, 0, 1, 0], arrival = [5, 9, 5, 1], status = [waiting, waiting, preempted, waiting], blocks = [0, 0, 0, 0], in_flight = [0, 0, 0, 0], queued = [3, 4, -1, 2], rank = [2, 3, 0, 1]}
    sched.yield
  }
}

// FCFS: req.sort %w by ["queued"] {id = [6, 7, 4, 5]}
// PRIO: req.sort %w by ["priority", "arrival", "rank"] {id = [7, 5, 6, 4]}
