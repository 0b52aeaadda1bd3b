"""Per-step latency of vLLM 0.32's v1 scheduler and schedir's `vllm` preset on one trace.

Both engines run in this one process, on the same synthetic trace, through the parity
harness's engine loop and fake model runner (`schedir.tools.parity.harness`). For each target
size N the trace is a burst of N requests at step 0 with short prompts (16-64 tokens)
and long outputs, a KV cache big enough that nothing is preempted, a 8192-token budget
and max_num_seqs = N: after one or two prefill steps every request decodes, so the
steady state holds ~N running requests until the outputs run out.

Timed: exactly `schedule()` and exactly the update call (vLLM: `update_from_output`,
schedir: `update`), each with `time.perf_counter_ns`, only on steady-state decode steps
(no new, resumed or preempted request; one token per request) whose batch size lies in
a window around N (24-40 for 32, 224-256 for 256, like the reference driver's
buckets). Model outputs (vLLM's `ModelRunnerOutput`, schedir's dict or token array)
are built outside the timed region. schedir runs twice per repetition: once updated
with a dict {req_id: [token]}, once with the aligned int array (fast path). Every
engine first runs a short untimed copy of each trace (imports, Numba JIT). Passes
alternate their order between repetitions; medians and p90s pool all repetitions.
Decisions are compared step by step with `parity.compare`.

Light-load scenarios (`--scenarios`, issue 18): parity-style traces with prefills, a waiting
queue and prefix caching on, where every step with 1-32 scheduled requests is timed (prefill,
mixed and decode steps alike, not only steady decode):
- `mixed`: <= 32 running (max_num_seqs 32), Poisson arrivals above the service rate so a
  waiting queue builds up, prompts 32-1024 tokens (half of them on one of 4 shared prefixes),
  outputs 16-256, a 2048-token budget and a KV cache small enough to preempt now and then;
- `few-b32`: ~6 running (max_num_seqs 6) with 32-token blocks, a waiting queue, shared prefixes;
- `one`: one request at a time (8 requests, each arriving after the previous one finished).

    python benchmarks/step_latency.py [--sizes 32,256] [--scenarios mixed,few-b32,one] [--reps 5]
                                      [--quick] [--json OUT]

Without vLLM installed, schedir runs alone and the script says vLLM is missing.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import platform
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from schedir.tools.parity.harness import (
    Engine,
    ParityConfig,
    SchedirEngine,
    StepRecord,
    TraceRequest,
    compare,
    make_trace,
    run_engine,
)

WINDOWS: dict[int, tuple[int, int]] = {32: (24, 40), 64: (56, 72), 128: (112, 144), 256: (224, 256)}
"""Batch-size windows of the reference driver's buckets; other sizes get N*7/8..N*9/8."""
PROMPT_MIN, PROMPT_MAX = 16, 64
OUTPUT_LEN = 256
QUICK_OUTPUT_LEN = 48
WARMUP_OUTPUT_LEN = 6
VARIANTS: tuple[str, ...] = ("vllm", "schedir-vllm", "schedir-dict", "schedir-array")
"""vLLM's own scheduler; schedir's vLLM plug-in (`schedir.engines.vllm.Scheduler`) driven exactly as
vLLM's is, through `schedule()` and `update_from_output()` with every conversion; schedir's runtime
with a dict update and with the token-array fast path."""
NEEDS_VLLM = ("vllm", "schedir-vllm")


def window(n: int) -> tuple[int, int]:
    """Batch sizes (running requests) that count as "about n"."""
    return WINDOWS.get(n, (n - n // 8, n + n // 8))


def bench_config(n: int, output_len: int) -> ParityConfig:
    """A burst of n short-prompt, long-output requests that all fit: steady decode at ~n running."""
    output_max = output_len + output_len // 8
    blocks_per_req = -(-(PROMPT_MAX + output_max) // 16) + 1
    return ParityConfig(
        block_size=16,
        num_blocks=n * blocks_per_req + 64,
        max_num_batched_tokens=8192,
        max_num_seqs=n,
        num_requests=n,
        arrival_rate=0.0,
        prompt_min=PROMPT_MIN,
        prompt_max=PROMPT_MAX,
        output_min=output_len,
        output_max=output_max,
        num_shared_prefixes=0,
        share_prob=0.0,
        seed=n,
        name=f"burst-{n}",
    )


LIGHT_WINDOW = (1, 32)
"""Light load: steps scheduling 1-32 requests (any mix of prefill and decode) are timed."""
SCENARIOS: tuple[str, ...] = ("mixed", "few-b32", "one")
ONE_GAP = 320
"""`one`: steps between arrivals, more than a request's prefill and output take."""


def scenario_config(name: str, quick: bool = False) -> ParityConfig:
    """A light-load scenario's parity config (see the module docstring)."""
    k = 2 if quick else 1  # quick: fewer requests, same shape
    if name == "mixed":
        return ParityConfig(block_size=16, num_blocks=1000, max_num_batched_tokens=2048, max_num_seqs=32,
                            num_requests=160 // k, arrival_rate=0.3, prompt_min=32, prompt_max=1024, output_min=16,
                            output_max=256, num_shared_prefixes=4, share_prob=0.5, seed=18, name="mixed")
    if name == "few-b32":
        return ParityConfig(block_size=32, num_blocks=400, max_num_batched_tokens=2048, max_num_seqs=6,
                            num_requests=60 // k, arrival_rate=0.05, prompt_min=32, prompt_max=1024, output_min=64,
                            output_max=256, num_shared_prefixes=4, share_prob=0.5, seed=6, name="few-b32")
    if name == "one":
        return ParityConfig(block_size=16, num_blocks=1000, max_num_batched_tokens=2048, max_num_seqs=32,
                            num_requests=8 // k, arrival_rate=1.0, prompt_min=32, prompt_max=1024, output_min=128,
                            output_max=256, num_shared_prefixes=2, share_prob=0.5, seed=1, name="one")
    raise ValueError(f"unknown scenario '{name}' (scenarios: {', '.join(SCENARIOS)})")


def scenario_trace(name: str, cfg: ParityConfig) -> list[TraceRequest]:
    trace = make_trace(cfg)
    if name == "one":  # one request at a time: arrivals spaced past each request's end
        trace = [attrs.evolve(r, arrival_step=i * ONE_GAP) for i, r in enumerate(trace)]
    return trace


@attrs.frozen
class Case:
    """One timed trace: a burst size N (steady decode steps in its window) or a light-load scenario
    (every step with a batch in LIGHT_WINDOW)."""

    label: str
    cfg: ParityConfig
    trace: list[TraceRequest]
    lo: int
    hi: int
    decode_only: bool
    warm_cfg: ParityConfig
    warm_trace: list[TraceRequest]


def size_case(n: int, output_len: int) -> Case:
    cfg = bench_config(n, output_len)
    warm = bench_config(n, WARMUP_OUTPUT_LEN)
    lo, hi = window(n)
    return Case(str(n), cfg, make_trace(cfg), lo, hi, True, warm, make_trace(warm))


def scenario_case(name: str, quick: bool) -> Case:
    cfg = scenario_config(name, quick)
    warm = attrs.evolve(cfg, num_requests=min(cfg.num_requests, 6), output_min=4, output_max=8)
    trace = scenario_trace(name, cfg)
    warm_trace = [attrs.evolve(r, arrival_step=r.arrival_step // 40) for r in scenario_trace(name, warm)]
    return Case(name, cfg, trace, *LIGHT_WINDOW, False, warm, warm_trace)


class Probe:
    """Adds up the nanoseconds spent in wrapped functions until `take()` (profile passes only)."""

    def __init__(self) -> None:
        self.acc: dict[str, int] = defaultdict(int)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        acc, clock = self.acc, time.perf_counter_ns

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[name] += clock() - t0

        return timed

    def take(self) -> dict[str, int]:
        parts = dict(self.acc)
        self.acc.clear()
        return parts


class TimedCalls:
    """Forwards everything to a scheduler; times exactly `schedule()` and the update call.

    With `pass_timings`, copies schedir's `manager.timings` (the last step's passes)
    after each `schedule()`, outside the timed region.
    """

    def __init__(self, inner: Any, pass_timings: bool = False) -> None:
        self._inner = inner
        self._pass_timings = pass_timings
        self.schedule_ns: list[int] = []
        self.update_ns: list[int] = []
        self.passes: list[tuple[tuple[str, float], ...]] = []
        self.probe: Probe | None = None
        self.schedule_parts: list[dict[str, int]] = []
        self.update_parts: list[dict[str, int]] = []
        self.waiting: list[int] = []  # schedir: waiting requests after each schedule() (untimed)
        self._steady_seen = 0  # schedir: steady steps counted so far (see `schedule`)

    def schedule(self) -> Any:
        clock = time.perf_counter_ns
        t0 = clock()
        out = self._inner.schedule()
        t1 = clock()
        self.schedule_ns.append(t1 - t0)
        if self._pass_timings:
            metrics = getattr(self._inner, "metrics", None)
            steady = metrics is not None and getattr(metrics, "steady_steps", 0) > self._steady_seen
            if steady:  # lowered without its IR: no pass ran (the manager's timings are an older step's)
                self._steady_seen = metrics.steady_steps
            self.passes.append(() if steady else tuple((t.name, t.seconds) for t in self._inner.manager.timings))
            self.waiting.append(int(self._inner.waiting.size))
        if self.probe is not None:
            self.schedule_parts.append(self.probe.take())
        return out

    def update(self, output: Any, sampled: Any) -> Any:
        clock = time.perf_counter_ns
        t0 = clock()
        res = self._inner.update(output, sampled)
        t1 = clock()
        self.update_ns.append(t1 - t0)
        if self.probe is not None:
            self.update_parts.append(self.probe.take())
        return res

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        clock = time.perf_counter_ns
        t0 = clock()
        res = self._inner.update_from_output(scheduler_output, model_runner_output)
        t1 = clock()
        self.update_ns.append(t1 - t0)
        return res

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class SchedirArrayEngine(SchedirEngine):
    """schedir updated through the fast path: one token per `output.req_ids` entry, -1 for none."""

    def update(self, sampled: dict[str, list[int]]) -> None:
        out: Any = self._out
        ids = out.req_ids
        toks = np.fromiter((v[0] if (v := sampled.get(rid)) else -1 for rid in ids), dtype=np.int64, count=len(ids))
        finished = self._sched.update(out, toks)  # timed inside TimedCalls, the array built above is not
        self._finish_unreported |= bool(finished)


@attrs.frozen
class PassRun:
    """One engine's pass over one trace: its records and, step by step, the timings."""

    records: list[StepRecord]
    schedule_ns: list[int]
    update_ns: list[int]
    passes: list[tuple[tuple[str, float], ...]]
    waiting: list[int]


def make_engine(variant: str, cfg: ParityConfig) -> tuple[Engine, TimedCalls]:
    """A fresh engine of `variant` whose scheduler calls are timed."""
    if variant in NEEDS_VLLM:
        from schedir.tools.parity.vllm_driver import VllmEngine

        plugin = None
        if variant == "schedir-vllm":
            from schedir.engines.vllm import Scheduler as plugin
        engine: Any = VllmEngine(cfg, scheduler_cls=plugin)
        timed = TimedCalls(engine._sched)
    else:
        engine = SchedirArrayEngine(cfg) if variant == "schedir-array" else SchedirEngine(cfg)
        timed = TimedCalls(engine._sched, pass_timings=True)
    engine._sched = timed
    return engine, timed


def run_pass(variant: str, cfg: ParityConfig, trace: Sequence[TraceRequest], no_gc: bool) -> PassRun:
    """Drive one fresh engine over `trace` (engine construction untimed)."""
    engine, timed = make_engine(variant, cfg)
    gc.collect()
    if no_gc:
        gc.disable()
    try:
        records = run_engine(engine, trace)
    finally:
        gc.enable()
    n = len(records)
    if len(timed.schedule_ns) != n or len(timed.update_ns) != n:
        raise RuntimeError(
            f"{variant}: {n} records but {len(timed.schedule_ns)} schedule / {len(timed.update_ns)} update timings"
        )
    return PassRun(records, timed.schedule_ns, timed.update_ns, timed.passes, timed.waiting)


def steady_steps(records: Sequence[StepRecord], lo: int, hi: int) -> list[int]:
    """Indices of pure decode steps (no new/resumed/preempted, one token each) with lo..hi requests."""
    picked = []
    for i, r in enumerate(records):
        if r.new or r.preempted or not (lo <= len(r.cached) <= hi):
            continue
        if all(e[1] == 1 and not e[2] for e in r.cached):
            picked.append(i)
    return picked


def timed_steps(records: Sequence[StepRecord], case: Case) -> list[int]:
    """The steps a case times: steady decode steps in its window (sizes), or every step whose
    batch (new + cached requests) lies in the window (light-load scenarios)."""
    if case.decode_only:
        return steady_steps(records, case.lo, case.hi)
    return [i for i, r in enumerate(records) if case.lo <= len(r.new) + len(r.cached) <= case.hi]


def trace_shape(run: PassRun, idx: Sequence[int]) -> dict[str, float]:
    """What the timed steps held: mean batch, and the share with prefills, preemptions and a waiting queue."""
    recs = [run.records[i] for i in idx]
    if not recs:
        return {}
    shape = {
        "mean_batch": float(np.mean([len(r.new) + len(r.cached) for r in recs])),
        "max_batch": max(len(r.new) + len(r.cached) for r in recs),
        "with_new_or_resumed": float(np.mean([bool(r.new) or any(e[2] for e in r.cached) for r in recs])),
        "with_prefill_chunk": float(np.mean([bool(r.new) or any(e[1] > 1 for e in r.cached) for r in recs])),
        "preemptions": sum(len(r.preempted) for r in recs),
        "prefix_hit_tokens": sum(e[2] for r in recs for e in r.new),
    }
    if run.waiting:
        shape["with_waiting"] = float(np.mean([run.waiting[i] > 0 for i in idx]))
        shape["mean_waiting"] = float(np.mean([run.waiting[i] for i in idx]))
    return shape


def stats_us(ns: Sequence[int]) -> dict[str, float | int]:
    """Median and p90 in microseconds."""
    if not ns:
        return {"median_us": float("nan"), "p90_us": float("nan"), "n": 0}
    a = np.asarray(ns, dtype=np.float64) / 1e3
    return {"median_us": float(np.median(a)), "p90_us": float(np.percentile(a, 90)), "n": int(a.size)}


@attrs.define
class Collected:
    """One variant's timings on one size, pooled over repetitions."""

    schedule_ns: list[int] = attrs.field(factory=list)
    update_ns: list[int] = attrs.field(factory=list)
    passes: list[tuple[tuple[str, float], ...]] = attrs.field(factory=list)
    steps_per_rep: list[int] = attrs.field(factory=list)
    error: str | None = None


def collect(run: PassRun, case: Case, into: Collected) -> None:
    idx = timed_steps(run.records, case)
    into.steps_per_rep.append(len(idx))
    into.schedule_ns.extend(run.schedule_ns[i] for i in idx)
    into.update_ns.extend(run.update_ns[i] for i in idx)
    if run.passes:
        into.passes.extend(run.passes[i] for i in idx)


def pass_breakdown(c: Collected) -> dict[str, float]:
    """Median µs of each schedir pass, and of the rest of `schedule()` (IR build, lowering, bookkeeping)."""
    if not c.passes:
        return {}
    per: dict[str, list[float]] = defaultdict(list)
    rest: list[float] = []
    for step_passes, total_ns in zip(c.passes, c.schedule_ns, strict=True):
        for name, sec in step_passes:
            per[name].append(sec * 1e6)
        rest.append(total_ns / 1e3 - sum(sec for _, sec in step_passes) * 1e6)
    out = {name: float(np.median(v)) for name, v in per.items()}
    out["(rest: build IR + lower)"] = float(np.median(rest))
    return out


PROBED = ("build_step", "settle_step", "apply_samples")
"""Functions `schedir.runtime.scheduler` calls by module-global name; the profile pass wraps them."""


def profile_schedir(variant: str, case: Case) -> dict:
    """Where schedir's time goes, from one extra pass with timers around its parts.

    Wrapped: `build_step` and `RecycledStep.refill` (the step IR: built fresh, or the
    recycled skeleton refilled), `PassManager.run`, `Scheduler._lower`, `settle_step`
    (inside `_lower`: queues, lifecycle and batch plan in one kernel) and `apply_samples`;
    each wrapper adds well under 1 µs, and no headline
    number comes from this pass. Returns medians in µs over the window's decode steps.
    """
    import schedir.runtime.scheduler as rt

    probe = Probe()
    saved = {name: getattr(rt, name) for name in PROBED if hasattr(rt, name)}
    manager_cls = rt.PassManager if hasattr(rt, "PassManager") else None
    manager_run = manager_cls.run if manager_cls is not None else None
    recycled_cls = getattr(rt, "RecycledStep", None)
    refill = recycled_cls.refill if recycled_cls is not None else None
    try:
        for name, fn in saved.items():
            setattr(rt, name, probe.wrap(name, fn))
        if recycled_cls is not None and refill is not None:
            recycled_cls.refill = probe.wrap("refill", refill)  # type: ignore[method-assign]
        if manager_cls is not None and manager_run is not None:
            manager_cls.run = probe.wrap("manager.run", manager_run)  # type: ignore[method-assign]
        engine, timed = make_engine(variant, case.cfg)
        inner = timed._inner
        if hasattr(inner, "_lower"):
            inner._lower = probe.wrap("_lower", inner._lower)
        if hasattr(inner, "_steady_step"):  # a steady decode step lowered without its IR, or the test that fell back
            steady_step, acc, clock = inner._steady_step, probe.acc, time.perf_counter_ns

            def timed_steady(*args: Any) -> Any:
                t0 = clock()
                out = steady_step(*args)
                acc["steady" if out is not None else "steady test"] += clock() - t0
                return out

            inner._steady_step = timed_steady
        timed.probe = probe
        gc.collect()
        records = run_engine(engine, case.trace)
    finally:
        for name, fn in saved.items():
            setattr(rt, name, fn)
        if manager_cls is not None and manager_run is not None:
            manager_cls.run = manager_run  # type: ignore[method-assign]
        if recycled_cls is not None and refill is not None:
            recycled_cls.refill = refill  # type: ignore[method-assign]
    idx = timed_steps(records, case)
    sched: dict[str, list[float]] = defaultdict(list)
    upd: dict[str, list[float]] = defaultdict(list)
    pass_names = list(dict.fromkeys(name for i in idx for name, _ in timed.passes[i]))
    for i in idx:
        parts = {k: v / 1e3 for k, v in timed.schedule_parts[i].items()}
        passes = ([(name, sec * 1e6) for name, sec in timed.passes[i]] if timed.passes[i]
                  else [(name, 0.0) for name in pass_names])  # a steady step ran no pass
        total = timed.schedule_ns[i] / 1e3
        in_passes = sum(us for _, us in passes)
        build = parts.get("build_step", 0.0) + parts.get("refill", 0.0)
        sched["step IR (build or refill)"].append(build)
        for name, us in passes:
            sched[f"pass {name}"].append(us)
        sched["PassManager.run minus passes"].append(parts.get("manager.run", in_passes) - in_passes)
        sched["_lower"].append(parts.get("_lower", 0.0))
        sched["steady step (no IR; settle_step included)"].append(parts.get("steady", 0.0))
        sched["  of which settle_step"].append(parts.get("settle_step", 0.0))
        sched["steady test that fell back to the IR"].append(parts.get("steady test", 0.0))
        known = (build + parts.get("manager.run", in_passes) + parts.get("_lower", 0.0) + parts.get("steady", 0.0)
                 + parts.get("steady test", 0.0))
        sched["other (facts, queue columns, metrics)"].append(total - known)
        sched["total schedule()"].append(total)
        uparts, utotal = timed.update_parts[i], timed.update_ns[i] / 1e3
        upd["apply_samples (Numba)"].append(uparts.get("apply_samples", 0) / 1e3)
        upd["other (Python, NumPy)"].append(utotal - uparts.get("apply_samples", 0) / 1e3)
        upd["total update()"].append(utotal)
    return {
        "steps": len(idx),
        "schedule": {k: float(np.median(v)) for k, v in sched.items()},
        "update": {k: float(np.median(v)) for k, v in upd.items()},
    }


def try_import_vllm() -> tuple[str | None, str | None, float]:
    """(vLLM version, why it is missing, import seconds)."""
    t0 = time.perf_counter()
    logging.getLogger("vllm").setLevel(logging.ERROR)  # its CPU-platform warnings are noise here
    try:
        from schedir.tools.parity.vllm_driver import import_vllm

        vllm = import_vllm()
    except Exception as exc:  # noqa: BLE001 - no vLLM is a supported mode
        return None, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0
    return str(getattr(vllm, "__version__", "?")), None, time.perf_counter() - t0


def warm_up(variants: Sequence[str], cases: Sequence[Case], no_gc: bool) -> dict[str, str]:
    """Run every variant on a short copy of every case's trace (JIT, imports, first-call caches)."""
    errors: dict[str, str] = {}
    for case in cases:
        for v in variants:
            if v in errors:
                continue
            try:
                run_pass(v, case.warm_cfg, case.warm_trace, no_gc)
            except Exception as exc:  # noqa: BLE001 - a broken engine is reported, the others still run
                errors[v] = f"{type(exc).__name__}: {exc}"
    return errors


def fmt(s: dict[str, float | int]) -> str:
    return f"{s['median_us']:8.1f} / {s['p90_us']:8.1f}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:5.2f}x" if not (math.isnan(a) or math.isnan(b)) and b > 0 else "   - "


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="32,256", help="target running-request counts (comma-separated; '' for none)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"light-load scenarios (comma-separated from {', '.join(SCENARIOS)}; '' for none)")
    parser.add_argument("--reps", type=int, default=None, help="passes per engine and size (default 5, quick 1)")
    parser.add_argument(
        "--output-len",
        type=int,
        default=None,
        help=f"tokens each request generates at least (default {OUTPUT_LEN}, quick {QUICK_OUTPUT_LEN})",
    )
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"engines to run (comma-separated from {', '.join(VARIANTS)})")
    parser.add_argument("--quick", action="store_true", help="short outputs, one repetition")
    parser.add_argument("--no-gc", action="store_true", help="disable the garbage collector during timed passes")
    parser.add_argument("--no-profile", action="store_true", help="skip the probed schedir pass (time breakdown)")
    parser.add_argument("--json", metavar="OUT", help="write all results as JSON here")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    reps = args.reps if args.reps is not None else (1 if args.quick else 5)
    output_len = args.output_len if args.output_len is not None else (QUICK_OUTPUT_LEN if args.quick else OUTPUT_LEN)

    t_start = time.perf_counter()
    vllm_version, vllm_missing, import_s = try_import_vllm()
    asked = {v.strip() for v in args.variants.split(",") if v.strip()}
    unknown = asked - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)} (variants: {', '.join(VARIANTS)})")
    variants = [v for v in VARIANTS if v in asked and (v not in NEEDS_VLLM or vllm_version is not None)]
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    command = " ".join([os.path.basename(sys.executable), *sys.argv])
    machine = (
        f"{platform.machine()} {platform.processor() or ''}".strip()
        + f", os.cpu_count()={os.cpu_count()}, python {platform.python_version()}"
        + f", load avg {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}"
    )
    print(f"command: {command}")
    print(f"machine: {machine}")
    if vllm_version is None:
        print(f"vLLM missing, schedir runs alone: {vllm_missing}")
    else:
        print(f"vLLM {vllm_version} imported in {import_s:.1f} s")

    cases = [size_case(n, output_len) for n in sizes] + [scenario_case(name, args.quick) for name in scenarios]
    t0 = time.perf_counter()
    errors = warm_up(variants, cases, args.no_gc)
    print(
        f"warm-up ({', '.join(variants)}; every size, {WARMUP_OUTPUT_LEN}-token outputs): "
        f"{time.perf_counter() - t0:.1f} s" + "".join(f"\n  {v} FAILED: {e}" for v, e in errors.items())
    )

    results: dict[str, dict[str, Any]] = {}
    for case in cases:
        cfg, trace, lo, hi = case.cfg, case.trace, case.lo, case.hi
        shape: dict[str, float] = {}
        collected = {v: Collected(error=errors.get(v)) for v in variants}
        parity: dict[str, list[dict[str, Any]]] = defaultdict(list)
        t0 = time.perf_counter()
        for rep in range(reps):
            order = variants if rep % 2 == 0 else variants[::-1]
            runs: dict[str, PassRun] = {}
            for v in order:
                if collected[v].error is not None:
                    continue
                try:
                    runs[v] = run_pass(v, cfg, trace, args.no_gc)
                except Exception as exc:  # noqa: BLE001
                    collected[v].error = f"{type(exc).__name__}: {exc}"
                    continue
                collect(runs[v], case, collected[v])
                if v == "schedir-array" and rep == 0 and not case.decode_only:
                    shape = trace_shape(runs[v], timed_steps(runs[v].records, case))
            ref_name = "vllm" if "vllm" in runs else "schedir-dict"
            for v, run in runs.items():
                if v == ref_name or ref_name not in runs:
                    continue
                report = compare(runs[ref_name].records, run.records, names=(ref_name, v))
                parity[v].append(
                    {
                        "rep": rep,
                        "identical": report.decisions_identical,
                        "steps": report.steps,
                        "identical_steps": report.identical_steps,
                        "first_divergence": report.first_divergence,
                    }
                )
        results[case.label] = {
            "window": [lo, hi],
            "decode_only": case.decode_only,
            "shape": shape,
            "config": attrs.asdict(cfg),
            "wall_s": time.perf_counter() - t0,
            "reference": "vllm" if "vllm" in variants else "schedir-dict",
            "parity": dict(parity),
            "engines": {
                v: {
                    "schedule": stats_us(c.schedule_ns),
                    "update": stats_us(c.update_ns),
                    "steps_per_rep": c.steps_per_rep,
                    "passes_median_us": pass_breakdown(c),
                    "error": c.error,
                }
                for v, c in collected.items()
            },
        }

    if not args.no_profile:
        for case in cases:
            profiles: dict[str, Any] = {}
            for v in ("schedir-dict", "schedir-array"):
                if v in variants and not results[case.label]["engines"][v]["error"]:
                    try:
                        profiles[v] = profile_schedir(v, case)
                    except Exception as exc:  # noqa: BLE001 - the profile is an extra, never a failure
                        profiles[v] = {"error": f"{type(exc).__name__}: {exc}"}
            results[case.label]["profile"] = profiles

    print_report(results, variants, reps, output_len)
    print(f"total {time.perf_counter() - t_start:.1f} s")
    if args.json:
        doc = {
            "command": command,
            "machine": machine,
            "cpu_count": os.cpu_count(),
            "vllm": vllm_version,
            "vllm_missing": vllm_missing,
            "reps": reps,
            "output_len": output_len,
            "no_gc": args.no_gc,
            "cases": results,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        print(f"wrote {args.json}")
    bad = any(not p["identical"] for r in results.values() for ps in r["parity"].values() for p in ps)
    failed = any(e["error"] for r in results.values() for e in r["engines"].values())
    return 1 if bad or failed else 0


def print_report(results: dict[str, dict[str, Any]], variants: Sequence[str], reps: int, output_len: int) -> None:
    """The table: per size, each engine's schedule/update µs, the ratios, parity; then schedir's passes."""
    print(
        f"\ntrace per size N: N requests at step 0, prompts {PROMPT_MIN}-{PROMPT_MAX} tokens, outputs "
        f"{output_len}-{output_len + output_len // 8} tokens, budget 8192, max_num_seqs N, no preemption; "
        f"{reps} rep(s); timed: pure decode steps with running in the window"
    )
    if any(not r["decode_only"] for r in results.values()):
        print(
            "light-load scenarios (every step with 1-32 requests timed, prefills included; prefix caching on): "
            "mixed = <=32 running, queue, 16-token blocks, preemptions; few-b32 = ~6 running, 32-token blocks, "
            "queue; one = one request at a time"
        )
    head = f"{'running':>13}  {'engine':<14} {'schedule_us med / p90':>21}  {'update_us med / p90':>21}  {'steps':>6}"
    print(head)
    print("-" * len(head))
    for n, r in results.items():
        lo, hi = r["window"]
        label = f"{n} ({lo}-{hi})"
        if not r["decode_only"] and r["shape"]:
            sh = r["shape"]
            print(
                f"{label:>13}  light load, every step with {lo}-{hi} requests: mean batch {sh['mean_batch']:.1f} "
                f"(max {sh['max_batch']}), steps with new/resumed {100 * sh['with_new_or_resumed']:.0f}%, "
                f"with a prefill chunk {100 * sh['with_prefill_chunk']:.0f}%, "
                f"with a waiting queue {100 * sh.get('with_waiting', float('nan')):.0f}% "
                f"(mean {sh.get('mean_waiting', float('nan')):.1f}), preemptions {sh['preemptions']}"
            )
        eng = r["engines"]
        for v in variants:
            e = eng[v]
            if e["error"]:
                print(f"{label:>13}  {v:<14} FAILED: {e['error'].splitlines()[0][:150]}")
                continue
            print(f"{label:>13}  {v:<14} {fmt(e['schedule']):>21}  {fmt(e['update']):>21}  {e['schedule']['n']:>6}")
        if "vllm" in variants and not eng["vllm"]["error"]:
            vs, vu = eng["vllm"]["schedule"]["median_us"], eng["vllm"]["update"]["median_us"]
            parts = []
            for v in ("schedir-vllm", "schedir-dict", "schedir-array"):
                if v in eng and not eng[v]["error"]:
                    ss, su = eng[v]["schedule"]["median_us"], eng[v]["update"]["median_us"]
                    parts.append(f"{v[8:]}: schedule {ratio(vs, ss)} update {ratio(vu, su)} pair {ratio(vs + vu, ss + su)}")
            print(f"{label:>13}  ratio vllm/schedir (medians)  " + " | ".join(parts))
        for v, ps in r["parity"].items():
            ok = all(p["identical"] for p in ps)
            steps = ps[0]["steps"] if ps else ("-", "-")
            line = (
                f"{label:>13}  decisions {r['reference']} vs {v}: "
                f"{'identical' if ok else 'DIFFER'} ({steps[0]} vs {steps[1]} steps, {len(ps)} rep(s))"
            )
            print(line)
            if not ok:
                first = next(p for p in ps if not p["identical"])
                print("    " + str(first["first_divergence"]).replace("\n", "\n    "))
    summary = [(n, r) for n, r in results.items() if "vllm" in r["engines"] and not r["engines"]["vllm"]["error"]
               and "schedir-array" in r["engines"] and not r["engines"]["schedir-array"]["error"]]
    if summary:
        print("\nschedule() medians, schedir runtime (schedir-array) against vLLM in this run; targets: light load "
              "<= 0.5x vLLM, 256 running <= 100 µs")
        for n, r in summary:
            v = r["engines"]["vllm"]["schedule"]["median_us"]
            a = r["engines"]["schedir-array"]["schedule"]["median_us"]
            print(f"  {n:>8}  vllm {v:8.1f}  schedir {a:8.1f}  schedir/vllm {a / v:5.2f}")
    cols: dict[str, dict[str, Any]] = {}
    for n, r in results.items():
        for v, p in r.get("profile", {}).items():
            if "error" in p:
                print(f"\nprofile of {v} at {n} failed: {p['error']}")
            else:
                cols[f"{n}/{v[8:]}"] = p
    if cols:
        print(
            "\nschedir time breakdown: median µs per step of one extra probed pass per column "
            "(running/update path); medians of parts need not add up to the total"
        )
        print(f"  {'':<40}" + "".join(f"{c:>11}" for c in cols))
        print(f"  {'steps':<40}" + "".join(f"{p['steps']:>11}" for p in cols.values()))
        for call in ("schedule", "update"):
            names = list(dict.fromkeys(k for p in cols.values() for k in p[call]))
            for name in names:
                vals = "".join(f"{p[call].get(name, float('nan')):11.1f}" for p in cols.values())
                print(f"  {name if name.startswith('total') else '  ' + name:<40}" + vals)
        return
    sized = [k for k, r in results.items() if r["decode_only"]]
    big = max(sized, key=int) if sized else next(iter(results))
    rows = {v: e["passes_median_us"] for v, e in results[big]["engines"].items() if e.get("passes_median_us")}
    if rows:
        names = list(next(iter(rows.values())))
        print(f"\nschedir pass times at {big} running (median µs per step; rest = schedule() minus the passes):")
        print(f"  {'pass':<34}" + "".join(f"{v:>15}" for v in rows))
        for name in names:
            print(f"  {name:<34}" + "".join(f"{rows[v].get(name, float('nan')):15.1f}" for v in rows))


if __name__ == "__main__":
    sys.exit(main())
