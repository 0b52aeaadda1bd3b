"""Time SGLang 0.5.23's own `RadixCache` on given token streams (run with SGLang's python).

`benchmarks/radix_cache.py` writes the streams it times schedir's tree on and runs this script
in SGLang's environment, so both trees see the same operations in the same order: insert each
stream, match it again (a full hit), match it with a diverging last quarter (a split), then
evict one prompt's worth of tokens repeatedly. SGLang's tree is built with
`RadixCache.create_simulated` (no KV pools) and a stand-in allocator whose `free_segment` does
nothing, since eviction would hand the values back to a pool. Output: JSON medians in µs.

    /work/sgl-env/bin/python schedir/tools/parity/sglang_radix_bench.py --streams s.json --out o.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from array import array
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sglang_env import install_shims  # type: ignore[import-not-found]
else:
    from schedir.tools.parity.sglang_env import install_shims


class _NoPool:
    """Eviction hands values back to the allocator; the benchmark has no pool to give them to."""

    page_size = 1
    device = "cpu"

    def free_segment(self, *args: object, **kwargs: object) -> None:
        pass

    def free(self, *args: object, **kwargs: object) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        data = json.loads(Path(args.streams).read_text())
        streams, prompt, evictions = data["streams"], int(data["prompt"]), int(data["evictions"])
    except (OSError, ValueError, KeyError) as exc:
        print(f"sglang_radix_bench: bad --streams: {exc}", file=sys.stderr)
        return 2
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    install_shims()
    logging.disable(logging.WARNING)
    try:
        import torch
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
    except ImportError as exc:
        print(f"sglang_radix_bench: SGLang does not import here ({exc})", file=sys.stderr)
        return 3
    tree = RadixCache.create_simulated(mock_allocator=_NoPool())
    times: dict[str, list[float]] = {"insert": [], "match (full hit)": [], "match (split)": [], "evict (one prompt)": []}

    def timed(op: str, fn, *a):  # noqa: ANN001, ANN202
        t = time.perf_counter_ns()
        out = fn(*a)
        times[op].append((time.perf_counter_ns() - t) / 1000)
        return out

    for s in streams:
        key = array("q", s)
        value = torch.arange(len(s), dtype=torch.int64)
        timed("insert", tree.insert, InsertParams(key=RadixKey(key), value=value))
        timed("match (full hit)", tree.match_prefix, MatchPrefixParams(key=RadixKey(key)))
        tail = list(s)
        for j in range(len(tail) - prompt // 4, len(tail)):
            tail[j] += 1
        timed("match (split)", tree.match_prefix, MatchPrefixParams(key=RadixKey(array("q", tail))))
    for _ in range(evictions):
        timed("evict (one prompt)", tree.evict, EvictParams(num_tokens=prompt - prompt // 2))
    Path(args.out).write_text(json.dumps({op: statistics.median(v) for op, v in times.items() if v}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
