"""A/B of two source trees' `schedule()` cost, interleaved so a drifting machine moves both alike.

Why: on a shared machine the speed of one core drifts by 1.5x within minutes (and jumps by up to
2x between one millisecond and the next), so two runs of `preset_step.py` one after the other
compare the machine, not the trees. Here one worker process per tree (each importing schedir
and `preset_step` from its own tree, `PYTHONPATH`) holds the same schedulers as `preset_step.py`
(N decoding, N/2 waiting); the driver asks them in turn for a few steps at a time, and prints
per preset the median of their per-round medians and the median of the per-round ratios B/A
(the figure to read), beside the A/A control A'/A (how far from 1.000 a ratio strays when
nothing differs).

How the bias is handled. An A/A run of one tree against itself once read 1.00 for `vllm` but
0.77 for `sglang` (the worker asked second seemed favoured): each worker's per-round figure was
a single burst of `--steps` steps, so a worker could land on the machine's slow or fast moments.
Now:

* Fine interleaving: a round's `--steps` steps of a preset are taken in chunks of `--chunk`
  steps, the workers taking turns chunk by chunk, so within a round every worker samples the
  same stretch of time and a jump in the machine's speed falls on all of them.
* Alternating order: the order the workers take their turns in alternates chunk by chunk (A,B
  then B,A; with the control, each rotation of A,B,A' then its reverse), so over the run each
  worker goes first, second (and third) equally often and comes right after itself (warm
  caches) equally often; a linear drift cancels within every pair of chunks.
* One core: every worker is pinned to the same CPU (`--cpu`, default the last one this process
  may use; `--cpu -1` leaves them to the OS), so no worker sits on a slower vCPU than another.
  Every worker also gets the same PYTHONHASHSEED (0), so none lays its dicts out differently.

Reading the A/A control (on by default; `--no-control` drops it). A second worker process of
tree A, A', takes its turns exactly as A and B do, and the `A'/A` column is its median per-round
ratio to A: the same measurement as B/A between two processes of one tree, so its distance from
1.000 is this run's noise floor (and any bias left). Read B/A as a difference between the trees
only where it stands clearly further from 1.000 than A'/A does: beside an A'/A of 0.97 a B/A of
0.95 says nothing, one of 0.80 does. If A'/A is itself far from 1.000, the machine was too
noisy: rerun with more rounds. The control costs a third worker (about two seconds to start)
and half again the timed steps.

    git worktree add --detach /tmp/base HEAD~1
    python benchmarks/ab_step.py /tmp/base . --presets vllm,sglang --size 32 --rounds 10
    python benchmarks/ab_step.py . . --presets vllm,sglang --size 32 --rounds 4   # A/A: every ratio near 1
    python benchmarks/ab_step.py /tmp/base . --presets fastserve --size 256 --waiting 5000 --stat mean
    python benchmarks/ab_step.py /tmp/base . --presets vllm,sglang-mixed --finishing --stat ir --steps 60

`--stat mean` compares each round's mean step instead of its median: the steps that run their IR
(FastServe's swaps and admissions) weigh in. Both trees take the same decisions, so each worker's
IR steps fall on the same step numbers and the rounds compare like with like.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np


def worker(tree: str, presets: list[str], size: int, waiting: int | None = None, finishing: bool = False) -> None:
    """Serve `preset n` lines on stdin with the µs of each of n more steps of that preset."""
    sys.path.insert(0, str(Path(tree) / "benchmarks"))
    import preset_step as P  # noqa: PLC0415 (imported from this worker's tree)

    schedulers = {p: P._decoding_scheduler(p, size, waiting, finishing=finishing) for p in presets}
    for s in schedulers.values():
        P._timed_steps(s, 30, [])  # Numba, caches, the steady state
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            break
        times: list[float] = []
        ir_times: list[float] = []  # those of the steps that ran their IR (or decided it over arrays)
        P._timed_steps(schedulers[words[0]], int(words[1]), times, ir_times)
        print(" ".join(f"{t * 1e6:.3f}" for t in times), "|", " ".join(f"{t * 1e6:.3f}" for t in ir_times),
              flush=True)


def turn_orders(n: int) -> list[list[int]]:
    """The orders the `n` workers take their turns in, chunk after chunk (cycled): each rotation
    of 0..n-1 followed by its reverse, so every pair of chunks is a palindrome (a linear drift
    falls on every worker alike) and over 2n chunks each worker takes each place, and follows
    itself, equally often. For two workers: [0, 1], [1, 0], [1, 0], [0, 1]."""
    orders = []
    for k in range(n):
        rot = [(k + j) % n for j in range(n)]
        orders += [rot, rot[::-1]]
    return orders


def _pin_cpu(cpu: int | None) -> int | None:
    """The CPU to pin every worker to: `cpu`, or the last one this process may use; None when
    pinning is off (-1) or the platform cannot pin."""
    if cpu == -1 or not hasattr(os, "sched_setaffinity"):
        return None
    return max(os.sched_getaffinity(0)) if cpu is None else cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree_a", help="the baseline source tree (its root: schedir/ and benchmarks/ in it)")
    ap.add_argument("tree_b", help="the tree to compare")
    ap.add_argument("--presets", default="vllm,sglang")
    ap.add_argument("--size", type=int, default=32, help="running requests (N)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=40, help="steps per preset per round (per worker)")
    ap.add_argument("--chunk", type=int, default=5, help="steps a worker takes per turn")
    ap.add_argument("--no-control", action="store_true",
                    help="skip the A/A control (a second worker of tree A: the A'/A column)")
    ap.add_argument("--cpu", type=int, default=None,
                    help="the CPU every worker is pinned to (default: the last allowed; -1: no pinning)")
    ap.add_argument("--waiting", type=int, help="requests waiting behind the full batch (default N/2)")
    ap.add_argument("--stat", choices=("median", "mean", "ir"), default="median",
                    help="each round's figure: the median step (the steady steps), the mean (the steps that "
                         "run their IR weigh in: both trees take the same decisions, so the same steps), or the "
                         "median of the steps that ran their IR (or decided it over arrays)")
    ap.add_argument("--finishing", action="store_true",
                    help="requests generate 20-399 tokens, as preset_step.py --finishing: admissions every few "
                         "steps (read with --stat mean, or --stat ir: the steps that ran their IR)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    presets = [p for p in args.presets.split(",") if p]
    if args.worker:
        worker(args.tree_a, presets, args.size, args.waiting, args.finishing)
        return 0
    trees = [str(Path(t).resolve()) for t in (args.tree_a, args.tree_b)]
    for t in trees:
        if not (Path(t) / "schedir").is_dir() or not (Path(t) / "benchmarks" / "preset_step.py").is_file():
            print(f"ab_step: {t} is not a schedir source tree (no schedir/ or benchmarks/preset_step.py)")
            return 2
    worker_trees = trees if args.no_control else [*trees, trees[0]]  # 0: A, 1: B, 2: A' (the control)
    cpu = _pin_cpu(args.cpu)
    workers = []
    for t in worker_trees:  # this file's worker in every tree (the protocol is its own); schedir from the tree's
        env = dict(os.environ, PYTHONPATH=t, PYTHONHASHSEED="0")
        cmd = [sys.executable, str(Path(__file__).resolve()), t, t, "--worker",
               "--presets", ",".join(presets), "--size", str(args.size),
               *([] if args.waiting is None else ["--waiting", str(args.waiting)]),
               *(["--finishing"] if args.finishing else [])]
        w = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        if cpu is not None:
            os.sched_setaffinity(w.pid, {cpu})  # before its warm-up: it warms up where it is timed
        if w.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
            print(f"ab_step: the worker for {t} did not start (see its error above)")
            return 2
        workers.append(w)

    def ask(i: int, preset: str, n: int) -> list[float]:
        """The µs of `n` more steps of `preset` on worker i (with --stat ir: of those that ran their IR)."""
        w = workers[i]
        w.stdin.write(f"{preset} {n}\n")  # type: ignore[union-attr]
        w.stdin.flush()  # type: ignore[union-attr]
        every, _, ir = w.stdout.readline().partition("|")  # type: ignore[union-attr]
        return [float(x) for x in (ir if args.stat == "ir" else every).split()]

    chunk = max(1, min(args.chunk, args.steps))
    orders = turn_orders(len(workers))
    turn = 0
    medians: dict[tuple[int, str], list[float]] = {(i, p): [] for i in range(len(workers)) for p in presets}
    for _ in range(args.rounds):
        for p in presets:
            times: list[list[float]] = [[] for _ in workers]
            for start in range(0, args.steps, chunk):
                for i in orders[turn % len(orders)]:
                    times[i] += ask(i, p, min(chunk, args.steps - start))
                turn += 1
            for i, t in enumerate(times):
                if not t:  # (--stat ir: no step of this round ran its IR)
                    print(f"ab_step: no step of {p} ran its IR in a round of {args.steps} steps: raise --steps "
                          "(or add --finishing)")
                    for w in workers:
                        w.kill()
                    return 2
                medians[(i, p)].append(float(np.mean(t) if args.stat == "mean" else np.median(t)))
    for w in workers:
        w.stdin.write("\n")  # type: ignore[union-attr]
        w.stdin.flush()  # type: ignore[union-attr]
        w.wait()
    pinned = "not pinned" if cpu is None else f"pinned to CPU {cpu}"
    behind = "N/2" if args.waiting is None else f"{args.waiting:,}"
    stat = "IR steps' medians" if args.stat == "ir" else f"{args.stat}s"
    finishing = ", requests finishing" if args.finishing else ""
    print(f"schedule() {stat}, µs, N={args.size} running + {behind} waiting{finishing}, {args.rounds} rounds of "
          f"{args.steps} steps taken {chunk} at a time in alternating order, workers {pinned}")
    print(f"A = {trees[0]}\nB = {trees[1]}")
    if not args.no_control:
        print("A' = a second worker of A: A'/A is the A/A control, this run's noise floor for B/A")
    control = "" if args.no_control else " " + "A'/A".rjust(7)
    print(f"{'preset':<20} {'A':>9} {'B':>9} {'B/A':>7}{control}")
    for p in presets:
        a, b = np.array(medians[(0, p)]), np.array(medians[(1, p)])
        cell = "" if args.no_control else f" {np.median(np.array(medians[(2, p)]) / a):7.3f}"
        print(f"{p:<20} {np.median(a):9.1f} {np.median(b):9.1f} {np.median(b / a):7.3f}{cell}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
