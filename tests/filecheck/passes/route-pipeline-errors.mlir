// RUN: not schedir opt %s -p order-fcfs 2>&1 | filecheck %s --check-prefix=STEP
// RUN: not schedir opt %s -p route-least-load,order-fcfs 2>&1 | filecheck %s --check-prefix=MIX
// RUN: not schedir opt %s -p "route-cache-aware{hit-threshold=2.0}" 2>&1 | filecheck %s --check-prefix=OPT
// RUN: not schedir opt %s -p "route-least-lod" 2>&1 | filecheck %s --check-prefix=NAME

// A routing step takes routing passes only, and they check their options.
cluster.route_step 1 {now_us = 0, facts = []} {
  %fleet = cluster.fleet {id = [0], role = [both], queued = [0], running = [0], free_blocks = [1], total_blocks = [1], position = [0]}
  %req = cluster.arrivals {id = [1], prompt = [10], output = [1], ttft_slo_ms = [0], tbt_slo_ms = [0]}
}

// STEP: schedir: error: pass 'order-fcfs' runs on sched.step, but the input holds cluster.route_step ops
// MIX:  schedir: error: pass 'order-fcfs' runs on sched.step and 'route-least-load' on cluster.route_step: a pipeline cannot mix them
// OPT:  schedir: error: pass 'route-cache-aware': bad option: hit-threshold must lie in [0, 1], got 2.0
// NAME: schedir: error: unknown pass 'route-least-lod'; did you mean 'route-least-load'?
