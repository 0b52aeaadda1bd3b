"""A/B of two source trees' `schedule()` cost, interleaved so a drifting machine moves both alike.

Why: on a shared machine the speed of one core drifts by 1.5x within minutes, so two runs of
`preset_step.py` one after the other compare the machine, not the trees. Here one worker
process per tree (each importing schedir from its own tree, `PYTHONPATH`) holds the same
schedulers as `preset_step.py` (N decoding, N/2 waiting); the driver asks them in turn, round
after round, for the median of a few steps of each preset, and prints per preset the median of
those medians and the median of the per-round ratios B/A (the figure to read).

    git worktree add --detach /tmp/base HEAD~1
    python benchmarks/ab_step.py /tmp/base . --presets vllm,sglang --size 32 --rounds 10
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np


def worker(presets: list[str], size: int, steps: int) -> None:
    """Serve `preset` lines on stdin with the median µs of `steps` steps of it."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import preset_step as P  # noqa: PLC0415 (imported from this worker's tree)

    schedulers = {p: P._decoding_scheduler(p, size) for p in presets}
    for s in schedulers.values():
        P._timed_steps(s, 30, [])  # Numba, caches, the steady state
    print("ready", flush=True)
    for line in sys.stdin:
        name = line.strip()
        if not name:
            break
        times: list[float] = []
        P._timed_steps(schedulers[name], steps, times)
        print(f"{float(np.median(times)) * 1e6:.3f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree_a", help="the baseline source tree (its root: schedir/ and benchmarks/ in it)")
    ap.add_argument("tree_b", help="the tree to compare")
    ap.add_argument("--presets", default="vllm,sglang")
    ap.add_argument("--size", type=int, default=32, help="running requests (N)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=40, help="steps per preset per round")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    presets = [p for p in args.presets.split(",") if p]
    if args.worker:
        worker(presets, args.size, args.steps)
        return 0
    trees = [str(Path(t).resolve()) for t in (args.tree_a, args.tree_b)]
    for t in trees:
        if not (Path(t) / "schedir").is_dir() or not (Path(t) / "benchmarks" / "preset_step.py").is_file():
            print(f"ab_step: {t} is not a schedir source tree (no schedir/ or benchmarks/preset_step.py)")
            return 2
    workers = []
    for t in trees:
        env = dict(os.environ, PYTHONPATH=t)
        cmd = [sys.executable, str(Path(t) / "benchmarks" / "ab_step.py"), t, t, "--worker",
               "--presets", ",".join(presets), "--size", str(args.size), "--steps", str(args.steps)]
        if not (Path(t) / "benchmarks" / "ab_step.py").is_file():  # a baseline older than this tool
            cmd[1] = str(Path(__file__).resolve())
        w = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        if w.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
            print(f"ab_step: the worker for {t} did not start (see its error above)")
            return 2
        workers.append(w)
    medians: dict[tuple[int, str], list[float]] = {(i, p): [] for i in range(2) for p in presets}
    for r in range(args.rounds):
        for p in presets:
            order = [0, 1] if r % 2 == 0 else [1, 0]  # who goes first alternates
            for i in order:
                w = workers[i]
                w.stdin.write(p + "\n")  # type: ignore[union-attr]
                w.stdin.flush()  # type: ignore[union-attr]
                medians[(i, p)].append(float(w.stdout.readline()))  # type: ignore[union-attr]
    for w in workers:
        w.stdin.write("\n")  # type: ignore[union-attr]
        w.stdin.flush()  # type: ignore[union-attr]
        w.wait()
    print(f"schedule() medians, µs, N={args.size} running + N/2 waiting, {args.rounds} interleaved rounds of "
          f"{args.steps} steps")
    print(f"A = {trees[0]}\nB = {trees[1]}")
    print(f"{'preset':<20} {'A':>9} {'B':>9} {'B/A':>7}")
    for p in presets:
        a, b = np.array(medians[(0, p)]), np.array(medians[(1, p)])
        print(f"{p:<20} {np.median(a):9.1f} {np.median(b):9.1f} {np.median(b / a):7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
