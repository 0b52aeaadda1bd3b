"""Decode runs: consecutive steady decode steps of one simulated engine in one Numba kernel.

Most steps of a replay are steady: every running request decodes one token, nobody can be
admitted, and the step's only news is its GPU time. Run one at a time, each pays Python's fixed
cost three times (the runtime's `schedule()` and `update()`, the simulator's cost model,
accounting and step log: ~60 µs, ~80% of the Mooncake hour's steps). Until the next arrival,
such steps follow from the arrays alone, so `decode_run` loops over them in one call, each step
exactly as the one-step path takes it:

1. the runtime's decision (`Scheduler.decode_run_args`): with requests waiting, the vllm
   window's `admissible_bound` must admit nobody; then `steady_settle` (the steady test,
   blocks and prefix-cache registration, the request table) -- the run stops before the first
   step that is not steady, with nothing changed;
2. the cost model's step time and FLOPs for an all-decode batch (`CostModel.decode_terms`:
   the same expressions as `step_cost`, in the same order, so the same floats);
3. `account_step` (the sampled tokens, TTFT/TBT records) and the runtime's `apply_samples`;
   a step that finishes a request ends the run (the runtime retires it in Python,
   `Scheduler.decode_run_applied`);
4. the step's row of the step log.

Decisions, records and the step log are the one-step path's (tested step for step); only
`sched_us` differs: each step of a run records the run's wall time over its steps.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numba as nb
import numpy as np

from schedir.runtime.kernels import STEP_COMPUTED, STEP_GENERATION, STEP_KIND, apply_samples, steady_settle
from schedir.runtime.window import admissible_bound
from schedir.sim.cost_model import _batch_sums
from schedir.sim.records import STEP_FIELDS, account_step

if TYPE_CHECKING:
    from schedir.sim.engine import Engine

_NUM_FREE = 0  # kv_pool.NUM_FREE, spelled out (Numba's cache does not see another module's constants)
_NO_OFFSETS = np.zeros(0, dtype=np.int64)
MAX_RUN = 4096  # steps per call at most (the step rows it fills are allocated per call)


@nb.njit(cache=True)
def decode_run(until: float, now: float, max_steps: int, step_rows: np.ndarray, free_blocks: np.ndarray,
               # the runtime's side (Scheduler.decode_run_args)
               running, waiting, fcfs_window: bool, data, oversized, max_seqs: int, budget: int, steady_budget: int,
               max_model_len: int, caching: bool, block_size: int, ref, bhash, dup_next, nxt, prv, meta, cache, table,
               nblk, ncached, rhash, nhash, front: int, tail, stop_len: int, stop_rows, stop_ids, register: bool,
               # the simulator's: request log, cost model (CostModel.decode_terms), usable blocks
               row_index, input_len, vocab: int, first_scheduled_s, prefix_hit_tokens, first_token_s, last_token_s,
               tokens_out, gap_buf, gap_count: int, q_half: float, causal: float, total_s: float, total_flops: float,
               req_s: float, req_flops: float, layers: int, dec_overhead_s: float, dec_per_request_s: float,
               kv_bytes_per_token_layer: float, mem_bw: float, bw_eff: float, heads: int, head_dim: int,
               usable_blocks: int):
    """Run steady decode steps from `now` while no arrival is due (`until`), at most `max_steps`;
    each step's log row goes to `step_rows` (STEP_FIELDS order, `sched_us` left 0) and the free
    blocks after its decision to `free_blocks`. Returns (steps run, clock, gap count, the last
    step's `apply_samples` codes and attention count)."""
    n = running.size
    ones = np.ones(n, dtype=np.int64)
    idx = np.empty(n, dtype=np.int64)
    for i in range(n):
        idx[i] = row_index[running[i]]
    no_rows = np.zeros(0, dtype=np.int64)
    window = waiting if fcfs_window else no_rows
    done = np.zeros(n, dtype=np.int8)
    attention = 0
    steps = 0
    while steps < max_steps and now < until and gap_count + n <= gap_buf.size:
        if waiting.size and admissible_bound(data, running, window, oversized, max_seqs, budget, max_model_len, True,
                                             meta[_NUM_FREE], caching, rhash, nhash, nblk, ncached, cache,
                                             block_size) != 0:
            break
        ok, per_request, sampled, _, _, _, _, _ = steady_settle(
            running, running, data, steady_budget, max_model_len, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk,
            ncached, rhash, nhash, ones, front, waiting, block_size, False, False)
        if not ok:
            break
        free_blocks[steps] = meta[_NUM_FREE]
        computed = per_request[STEP_COMPUTED]
        # CostModel.step_cost for a batch of decodes: its expressions, in its order
        _, n_dec, dec_kv, _, qc = _batch_sums(ones, computed, q_half, causal)
        seconds = total_s + req_s
        seconds += layers * (dec_overhead_s + n_dec * dec_per_request_s
                             + dec_kv * kv_bytes_per_token_layer / (mem_bw * bw_eff))
        flops = total_flops + req_flops + layers * 4.0 * heads * head_dim * qc
        start = now
        now = start + seconds
        tokens = np.empty(n, dtype=np.int64)
        prefill, decode, gap_count = account_step(
            idx, ones, computed, sampled, per_request[STEP_KIND], input_len, vocab, start, now, first_scheduled_s,
            prefix_hit_tokens, first_token_s, last_token_s, tokens_out, gap_buf, gap_count, tokens)
        done, attention = apply_samples(running, per_request[STEP_GENERATION], _NO_OFFSETS, tokens, True, data, tail,
                                        rhash, nhash, block_size, stop_len, stop_rows, stop_ids, register, bhash,
                                        dup_next, cache, meta, table, ncached)
        row = step_rows[steps]
        row[0] = start
        row[1] = seconds
        row[2] = prefill
        row[3] = decode
        row[4] = n
        row[5] = waiting.size
        row[6] = 1.0 - meta[_NUM_FREE] / usable_blocks
        row[7] = 0.0
        row[8] = flops
        steps += 1
        if attention:
            break
    return steps, now, gap_count, done, attention


assert STEP_FIELDS == ("start_s", "gpu_s", "prefill_tokens", "decode_tokens", "num_reqs", "num_waiting", "kv_usage",
                       "sched_us", "flops"), "decode_run writes the step log's rows in this order: update it"


def run_decodes(engine: Engine, until: float, limit: int = MAX_RUN) -> int:
    """Run `engine`'s next steps as a decode run while they start before `until` (the next
    arrival or event), at most `limit`; returns how many ran (0: none could, nothing changed).
    The engine's clock, records, step log, `batch` and `finished` are then as after the same
    steps taken one by one."""
    if limit <= 0:
        return 0
    sched = engine.sched
    args = sched.decode_run_args()
    if args is None:
        return 0
    reqs = engine.reqs
    cost = engine.cost
    n = sched.running.size
    terms = cost.decode_terms(n)
    reqs.reserve_gaps(n * 64)
    limit = min(limit, MAX_RUN)
    rows = np.empty((limit, len(STEP_FIELDS)), dtype=np.float64)
    free_blocks = np.empty(limit, dtype=np.int64)
    t0 = time.perf_counter()
    steps, now, gap_count, done, attention = decode_run(
        until, engine.now, limit, rows, free_blocks, *args, engine.row_index, reqs.input_len, engine.vocab_size,
        reqs.first_scheduled_s, reqs.prefix_hit_tokens, reqs.first_token_s, reqs.last_token_s, reqs.tokens_out,
        reqs.gap_buf, reqs.gap_count, *terms, sched.pool.usable_blocks)
    if not steps:
        return 0
    reqs.gap_count = gap_count
    engine.now = now
    engine.batch = engine.row_index[sched.running]
    finished = sched.decode_run_applied(steps, time.perf_counter() - t0, free_blocks, done, attention)
    seconds = time.perf_counter() - t0
    rows = rows[:steps]
    rows[:, STEP_FIELDS.index("sched_us")] = seconds / steps * 1e6
    if attention:  # the last step's finished requests freed their blocks after its row was written
        pool = sched.pool
        rows[-1, STEP_FIELDS.index("num_waiting")] = sched.waiting.size
        rows[-1, STEP_FIELDS.index("kv_usage")] = 1.0 - pool.num_free / pool.usable_blocks
    engine.steps.extend(rows)
    engine.finished = fin = [int(name) for name in finished]
    if fin:
        reqs.finish_s[fin] = now
    engine.rejected = []
    engine.preempted = []
    engine.decode_run_steps += steps
    return steps
