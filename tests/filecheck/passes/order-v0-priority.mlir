// RUN: schedir opt %s -p "order-v0-priority" | filecheck %s
// RUN: sed 's/policy = "priority"/policy = "fcfs"/' %s | schedir opt - -p "order-v0-priority" | filecheck %s --check-prefix=FCFS

// vLLM v0's waiting deque under the priority policy, three runs front to back. Step 3 sorted the
// deque (v0_sort_step = 3): it then held the FCFS places 0..5 (v0_sort_lo, v0_sort_hi).
// - 10 (place -2) was preempted by v0's _schedule_running in that step, after the sort: in front.
// - 13 (place -1) was preempted by the priority rule itself in that step (v0_sorted_at = 3): it
//   was put in the deque before the sort, so it is in the sorted block.
// - 11, 12, 13 form the sorted block, by (priority, arrival): 12, 13, 11.
// - 15 and 14 arrived since (places above 5): at the back in arrival order, whatever their
//   priority (14's 0 is the best of all): v0 sorts again only in a step without prefills.
// Under FCFS the deque is the FCFS places alone.

builtin.module {
  sched.step 4 {token_budget = 64, max_seqs = 4, block_size = 4, free_blocks = 8, cached_free_blocks = 0, total_blocks = 8, max_model_len = 64, now_us = 0, policy = "priority", facts = []} {
    sched.state {v0_sort_step = 3.0, v0_sort_lo = 0.0, v0_sort_hi = 5.0}
    %waiting = req.queue waiting {id = [10, 11, 12, 13, 14, 15], prompt = [4, 4, 4, 4, 4, 4], computed = [0, 0, 0, 0, 0, 0], total = [4, 4, 4, 4, 4, 4], max_tokens = [4, 4, 4, 4, 4, 4], priority = [3, 2, 0, 1, 0, 3], arrival = [5, 100, 300, 50, 400, 350], status = [preempted, waiting, waiting, preempted, waiting, waiting], blocks = [0, 0, 0, 0, 0, 0], in_flight = [0, 0, 0, 0, 0, 0], queued = [-2, 1, 4, -1, 7, 6], rank = [0, 0, 0, 0, 0, 0], placeholders = [0, 0, 0, 0, 0, 0], stale = [0, 0, 0, 0, 0, 0], v0_sorted_at = [-1, -1, -1, 3, -1, -1]}
    sched.yield
  }
}

// CHECK:      req.sort %waiting by ["v0_deque_run", "priority", "arrival", "queued"] {id = [10, 12, 13, 11, 15, 14]}
// FCFS:       req.sort %waiting by ["queued"] {id = [10, 13, 11, 12, 15, 14]}
