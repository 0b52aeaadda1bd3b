"""Radix prefix cache costs: schedir's Numba tree against SGLang's own RadixCache and its rules in plain Python.

Workload: conversation-like token streams (a few system prompts shared by many requests, each
request a prompt of `--prompt` tokens), inserted, matched again (a full hit), matched with a
diverging tail (a split), and evicted in LRU order, on both trees in one run (each tree takes
the whole sequence on its own, not interleaved with the other's); medians in µs.
The `python` column is the reference tree of tests/test_radix_cache.py (SGLang 0.5.23's
`RadixCache` algorithm over Python objects); the `sglang` column is SGLang 0.5.23's own class,
timed in SGLang's environment on the same streams in the same order
(schedir/tools/parity/sglang_radix_bench.py; the column says why when that environment is absent).

    python benchmarks/radix_cache.py [--prompt 8192] [--requests 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_radix_cache import RefRadix  # noqa: E402  (the reference lives with its tests)

from schedir.lowering.radix_cache import RadixCache  # noqa: E402


def _streams(requests: int, prompt: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    systems = [rng.integers(3, 32000, size=prompt // 2) for _ in range(4)]
    return [np.concatenate([systems[i % 4], rng.integers(3, 32000, size=prompt - prompt // 2)]) for i in range(requests)]


def _time(fn, *args) -> float:
    t = time.perf_counter_ns()
    fn(*args)
    return (time.perf_counter_ns() - t) / 1000


def run(requests: int, prompt: int, seed: int) -> dict[str, dict[str, float]]:
    streams = _streams(requests, prompt, seed)
    lists = [s.tolist() for s in streams]
    fast, ref = RadixCache(), RefRadix(1)
    warm = RadixCache()
    warm.insert(streams[0])
    warm.match_prefix(streams[0])
    warm.evict(10)
    out: dict[str, dict[str, list[float]]] = {"schedir": {}, "python": {}}
    for name in out:
        out[name] = {"insert": [], "match (full hit)": [], "match (split)": [], "evict (one prompt)": []}
    # Each tree takes the whole stream on its own (as SGLang's does in its own process): timing
    # them interleaved would charge one tree for the cache lines the other's walk evicted.
    for s in streams:
        values = np.arange(s.size, dtype=np.int64)
        out["schedir"]["insert"].append(_time(fast.insert, s, values))
        out["schedir"]["match (full hit)"].append(_time(fast.match_prefix, s))
        tail = s.copy()
        tail[-prompt // 4:] += 1
        out["schedir"]["match (split)"].append(_time(fast.match_prefix, tail))
    for s, lst in zip(streams, lists, strict=True):
        out["python"]["insert"].append(_time(ref.insert, lst, list(range(len(lst)))))
        out["python"]["match (full hit)"].append(_time(ref.match, lst))
        tail = s.copy()
        tail[-prompt // 4:] += 1
        out["python"]["match (split)"].append(_time(ref.match, tail.tolist()))
    for _ in range(min(50, requests)):
        out["schedir"]["evict (one prompt)"].append(_time(fast.evict, prompt - prompt // 2))
    for _ in range(min(50, requests)):
        out["python"]["evict (one prompt)"].append(_time(ref.evict, prompt - prompt // 2))
    return {name: {op: statistics.median(v) for op, v in ops.items()} for name, ops in out.items()}


def sglang_medians(requests: int, prompt: int, seed: int) -> tuple[dict[str, float], str]:
    """SGLang's own RadixCache on the same streams, in its environment: (medians, why not)."""
    import json
    import subprocess
    import tempfile

    from schedir.tools.parity import sglang_reference

    why = sglang_reference.unavailable_reason()
    if why is not None:
        return {}, why
    script = Path(__file__).resolve().parent.parent / "schedir" / "tools" / "parity" / "sglang_radix_bench.py"
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "streams.json", Path(tmp) / "out.json"
        src.write_text(json.dumps({"streams": [s.tolist() for s in _streams(requests, prompt, seed)],
                                   "prompt": prompt, "evictions": min(50, requests)}))
        proc = subprocess.run([str(sglang_reference.sglang_python()), str(script), "--streams", str(src),
                               "--out", str(out)], capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            return {}, (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return json.loads(out.read_text()), ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=8192, help="tokens per request (default 8192)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    res = run(args.requests, args.prompt, args.seed)
    sgl, why = sglang_medians(args.requests, args.prompt, args.seed)
    print(f"radix cache, {args.requests} requests of {args.prompt} tokens (4 shared halves), medians in µs")
    print(f"{'operation':22} {'schedir':>10} {'python':>10} {'ratio':>8} {'sglang':>10} {'ratio':>8}")
    for op in res["schedir"]:
        a, b = res["schedir"][op], res["python"][op]
        c = f"{sgl[op]:10.1f} {sgl[op] / a:7.1f}x" if op in sgl else f"{'-':>10} {'':>8}"
        print(f"{op:22} {a:10.1f} {b:10.1f} {b / a:7.1f}x {c}")
    if why:
        print(f"sglang: not run ({why})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
