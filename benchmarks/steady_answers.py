"""The steady program against asking the passes in Python: a preset's steady step both ways.

    python benchmarks/steady_answers.py                 # every preset with a steady program
    python benchmarks/steady_answers.py --sizes 32 --presets fastserve

A stateful pipeline's steady decode steps ask each pass what it writes (`StepPass.steady_state`);
where every such pass has a lowered form the runtime asks them in one kernel call
(`schedir.lowering.steady_program`). This runs two schedulers of one preset side by side, N
requests decoding and N/2 waiting (as `preset_step.py`), one with the program and one asking
in Python (`SteadyAnswers.lowered = False`), in turns of 20 steps so that the machine's slow
moments fall on both, and prints each one's median `schedule()` µs and the ratio.
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from preset_step import _decoding_scheduler, engine_presets  # noqa: E402


def lowered_presets() -> list[str]:
    """The engine presets whose steady answers run as a program."""
    return [p for p in engine_presets() if _decoding_scheduler(p, 4)._answers.program is not None]


def side_by_side(preset: str, n: int, rounds: int, steps: int) -> tuple[float, float]:
    """Median µs of a steady step with the program and asking in Python, in alternating turns."""
    runs = {}
    for lowered in (True, False):
        s = _decoding_scheduler(preset, n)
        s._answers.lowered = lowered
        runs[lowered] = (s, [])
    clock = time.perf_counter
    for r in range(rounds):
        for lowered in ((True, False) if r % 2 else (False, True)):
            s, times = runs[lowered]
            for _ in range(steps):
                start = clock()
                out = s.schedule()
                times.append(clock() - start)
                s.update(out, np.full(len(out.req_ids), 7, dtype=np.int64))
    return float(np.median(runs[True][1])) * 1e6, float(np.median(runs[False][1])) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", help="comma-separated (default: every preset with a steady program)")
    parser.add_argument("--sizes", default="32,256")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    presets = args.presets.split(",") if args.presets else lowered_presets()
    print("schedule() median µs, steady program vs the passes asked in Python (turns of 20 steps)")
    print(f"{'preset':16s} {'N':>5s} {'program':>9s} {'python':>9s} {'ratio':>7s}")
    for preset in presets:
        for n in (int(v) for v in args.sizes.split(",")):
            program, python = side_by_side(preset, n, args.rounds, 20)
            print(f"{preset:16s} {n:5d} {program:9.1f} {python:9.1f} {program / python:6.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
