"""Where an overloaded preset's IR steps go: the step at N/2 and at 5,000 waiting, and its window.

Issue 15 asks that a preset's step cost not grow with the load. The steps that run their passes
(`preset_step.py --finishing`, its `IR med`) still grow for a few presets; this splits them. For
each preset and size N it runs two schedulers, N running with N/2 waiting and with `--waiting`
waiting (requests finishing, as `preset_step.py --finishing`), beside `vllm`'s two, in turns of
5 steps (the turns' order reversed every other time, so the machine's drift and its slow moments
fall on all of them alike), and prints per preset:

- IR N/2, IR W: the median step that ran its passes at each load, and their ratio (growth);
  x vllm: the larger load's against `vllm`'s there;
- IR W<=2: the median of the larger load's IR steps that moved at most 2 requests (`vllm`'s
  work: what the queue costs beside the policy's own moves), and its growth;
- window, kernels, share: at the larger load, the median time of the runtime's waiting window
  (`Scheduler._waiting_window`: the passes' declared windows, ranks and heads, built over the
  whole queue), of the Numba kernels called inside it (dispatch included; every kernel of the
  `schedir.ir`, `schedir.passes` and `schedir.lowering` modules is timed where the window calls
  it), and the window's share of the IR step;
- moved: the requests an IR step admits, preempts or swaps out, on average at each load (the
  policy's own work).

    python benchmarks/window_cost.py
    python benchmarks/window_cost.py --presets fastserve,with-all-passes --sizes 256 --waiting 5000

The kernels are timed by wrapping them, so the figures carry a few µs of wrapper per call; read
them as shares, not as the presets' costs (`preset_step.py` times those without wrappers).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import time
from collections import defaultdict

import numpy as np

from schedir.runtime.scheduler import Scheduler

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from preset_step import _decoding_scheduler  # noqa: E402

CHUNK = 5  # steps a scheduler takes in its turn
_DEFAULT = "fastserve,with-all-passes,sglang-mixed,vllm-v0-chunked,vtc,with-prefix-aware,vllm"


class _Clock:
    """Time spent in the window and in kernels called from it, per scheduler, this step."""

    def __init__(self) -> None:
        self.inside = False
        self.window = 0.0
        self.kernels = 0.0


def _instrument(clock: _Clock) -> list[tuple[object, str, object]]:
    """Wrap `Scheduler._waiting_window` and every Numba kernel that schedir's modules call by a
    module-level name, so the time inside the window and its kernels is added to `clock`.
    Returns what it replaced, as (owner, name, original), for `_restore`."""
    window = Scheduler._waiting_window
    replaced: list[tuple[object, str, object]] = [(Scheduler, "_waiting_window", window)]

    def timed_window(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        start = time.perf_counter()
        clock.inside = True
        try:
            return window(self, *args, **kwargs)
        finally:
            clock.inside = False
            clock.window += time.perf_counter() - start

    Scheduler._waiting_window = timed_window
    modules = [importlib.import_module(f"{package}.{info.name}")
               for package in ("schedir.ir", "schedir.passes", "schedir.lowering")
               for info in pkgutil.iter_modules(importlib.import_module(package).__path__)]
    kernels = [(m, name, value) for m in modules for name, value in vars(m).items() if hasattr(value, "py_func")]
    # a kernel another kernel calls stays as it is (a kernel compiled later must see a kernel there);
    # its time counts in its caller's
    called = {name for _, _, k in kernels for name in k.py_func.__code__.co_names}
    wrapped: dict[int, object] = {}
    for module, name, kernel in kernels:
        if name in called:
            continue
        if id(kernel) not in wrapped:
            wrapped[id(kernel)] = _timed_kernel(kernel, clock)
        replaced.append((module, name, kernel))
        setattr(module, name, wrapped[id(kernel)])
    return replaced


def _restore(replaced: list[tuple[object, str, object]]) -> None:
    for owner, name, original in replaced:
        setattr(owner, name, original)


def _timed_kernel(kernel, clock: _Clock):  # noqa: ANN001, ANN202
    def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if not clock.inside:
            return kernel(*args, **kwargs)
        start = time.perf_counter()
        try:
            return kernel(*args, **kwargs)
        finally:
            clock.kernels += time.perf_counter() - start
    timed.py_func = kernel.py_func  # (still a kernel to whoever looks)
    return timed


def _moved(out) -> int:  # noqa: ANN001
    return len(out.new_prompts) + len(out.preempted_req_ids) + len(out.swapped_out_req_ids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default=_DEFAULT)
    parser.add_argument("--sizes", default="32,256")
    parser.add_argument("--waiting", type=int, default=5000, help="the larger load's waiting requests")
    parser.add_argument("--steps", type=int, default=300, help="steps each scheduler takes, timed")
    args = parser.parse_args(argv)
    presets = [p for p in args.presets.split(",") if p]
    if "vllm" not in presets:
        presets.append("vllm")
    sizes = [int(n) for n in args.sizes.split(",") if n]
    _run(args, presets, sizes)
    return 0


def _run(args: argparse.Namespace, presets: list[str], sizes: list[int]) -> None:
    """Take the steps and print the table (see the module docstring)."""
    cases = [(p, n, w) for n in sizes for p in presets for w in (n // 2, args.waiting)]
    scheds = {c: _decoding_scheduler(c[0], c[1], c[2], True) for c in cases}
    ir: dict[tuple, list[float]] = defaultdict(list)
    window: dict[tuple, list[float]] = defaultdict(list)
    kernels: dict[tuple, list[float]] = defaultdict(list)
    moved: dict[tuple, list[int]] = defaultdict(list)
    for s in scheds.values():  # kernels compiled and loaded, queues past their first admissions
        for _ in range(60):
            out = s.schedule()
            s.update(out, np.full(len(out.req_ids), 7, dtype=np.int64))
    clock = _Clock()
    replaced = _instrument(clock)  # (after the kernels compiled: wrapped, they are no kernels to compile against)
    try:
        _take_steps(args, cases, scheds, clock, ir, window, kernels, moved)
    finally:
        _restore(replaced)
    _print(args, presets, sizes, ir, window, kernels, moved)


def _take_steps(args, cases, scheds, clock, ir, window, kernels, moved) -> None:  # noqa: ANN001
    """The timed steps, the schedulers in turns of `CHUNK` steps, the turns' order reversed every
    other time (a drift of the machine's speed, or a slow moment, falls on all of them alike)."""
    turns = max(args.steps // CHUNK, 1)
    for t in range(turns):
        for c in (cases if t % 2 == 0 else cases[::-1]):
            s = scheds[c]
            for _ in range(CHUNK):
                clock.window = clock.kernels = 0.0
                steady = s.metrics.steady_steps
                start = time.perf_counter()
                out = s.schedule()
                took = time.perf_counter() - start
                if s.metrics.steady_steps == steady:  # it ran its passes (IR or arrays)
                    ir[c].append(took)
                    moved[c].append(_moved(out))
                    if clock.window:
                        window[c].append(clock.window)
                        kernels[c].append(clock.kernels)
                s.update(out, np.full(len(out.req_ids), 7, dtype=np.int64))


def _print(args, presets, sizes, ir, window, kernels, moved) -> None:  # noqa: ANN001
    def med(values: list[float]) -> float:
        return float(np.median(values)) * 1e6 if values else float("nan")

    print(f"IR steps' medians, µs (requests finishing; N/2 and {args.waiting:,} waiting; "
          f"{max(args.steps // CHUNK, 1) * CHUNK} steps each, in turns of {CHUNK})")
    print(f"{'preset':18s} {'N':>4s} {'IR N/2':>8s} {'IR W':>8s} {'growth':>7s} {'x vllm':>7s} {'IR W<=2':>8s} "
          f"{'growth':>7s} {'window':>8s} {'kernels':>8s} {'share':>6s} {'moved N/2':>9s} {'moved W':>8s}")
    for n in sizes:
        base = med(ir[("vllm", n, args.waiting)])
        for p in presets:
            light, heavy = (p, n, n // 2), (p, n, args.waiting)
            a, b = med(ir[light]), med(ir[heavy])
            few = med([t for t, m in zip(ir[heavy], moved[heavy], strict=True) if m <= 2])
            win = med(window[heavy]) if window[heavy] else 0.0
            ker = med(kernels[heavy]) if kernels[heavy] else 0.0
            print(f"{p:18s} {n:4d} {a:8.1f} {b:8.1f} {b / a:6.2f}x {b / base:6.2f}x {few:8.1f} {few / a:6.2f}x "
                  f"{win:8.1f} {ker:8.1f} "
                  f"{(win / b if b else 0):5.0%} {np.mean(moved[light]) if moved[light] else 0:9.1f} "
                  f"{np.mean(moved[heavy]) if moved[heavy] else 0:8.1f}")


if __name__ == "__main__":
    raise SystemExit(main())
