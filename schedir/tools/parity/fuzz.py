"""Differential fuzzing: random configs and traces, vLLM 0.32's scheduler against schedir's.

Why: the parity matrix samples a dozen hand-picked scenarios; the rare interleavings
(preemption next to a prefix hit registered in the same step, long-prefill caps, a
priority victim, max_num_seqs, an abort mid-prefill) have to be searched for. A seeded
generator draws a `FuzzCase` (scheduler config + a trace described by a few numbers per
request), the parity harness runs both schedulers over it, and on a divergence a greedy
shrinker cuts the case down (fewer requests, shorter prompts and outputs, a simpler
config) while it still diverges. The minimal case is written as a small JSON file
(`tests/parity_cases/NAME.json`) that the parity tests replay.

A case is described, not enumerated: a prompt is `shared` tokens of a shared prefix pool
plus `unique` tokens of its own, and pools fork from one another (prefixes of random
depth). Token ids are a fixed function of (pool, position), so a JSON file of a few lines
reproduces the exact prompts on any machine.

The generator keeps to the region both schedulers are specified for, with a stated reason
(see `draw_case`): every request fits the whole cache (a larger one is rejected by schedir
and livelocks vLLM 0.32, which preempts it forever), every prompt is shorter than
max_model_len (vLLM's input processor refuses the rest before its scheduler sees them),
and the config passes vLLM's own validation (budget >= max_num_seqs, threshold <= model length).
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from schedir.tools.parity.harness import (
    VOCAB_HI,
    VOCAB_LO,
    EngineStalled,
    ParityConfig,
    ParityReport,
    StepRecord,
    TraceRequest,
    compare,
    drive_schedir,
)

CASES_DIR = Path(__file__).resolve().parents[3] / "tests" / "parity_cases"
"""Where shrunk divergent cases are kept as regression files (replayed by the parity tests)."""

_SPAN = VOCAB_HI - VOCAB_LO
_UNIQUE_NS = 1 << 24  # token namespace of a request's own tail (pools use 0 .. 2**24 - 1)


def _mix(keys: np.ndarray) -> np.ndarray:
    """splitmix64 over uint64 keys (wraps), the token-id hash."""
    z = keys.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _tokens(namespace: int, start: int, stop: int) -> np.ndarray:
    if stop <= start:
        return np.zeros(0, dtype=np.int64)
    keys = np.uint64(namespace) << np.uint64(24) | np.arange(start, stop, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return (_mix(keys) % np.uint64(_SPAN)).astype(np.int64) + VOCAB_LO


@attrs.frozen
class Pool:
    """A shared prefix: the first `fork` tokens of pool `parent` (if any), then its own tokens."""

    length: int
    parent: int | None = None
    fork: int = 0


@attrs.frozen
class FuzzRequest:
    """One request of a case: `shared` tokens of pool `pool` (None: no shared prefix), then
    `unique` tokens of its own. Aborted at the start of engine step `abort_step` unless None."""

    arrival: int
    unique: int
    max_tokens: int
    pool: int | None = None
    shared: int = 0
    priority: int = 0
    abort_step: int | None = None
    name: str | None = None
    """The request id; None: `r<index>` (zero-padded, so string order is arrival order). Other
    names make vLLM's priority tie-break (request id, for equal priority and arrival) differ
    from arrival order."""

    @property
    def prompt_len(self) -> int:
        return self.shared + self.unique


SCHED_FIELDS = ("block_size", "num_blocks", "max_num_batched_tokens", "max_num_seqs", "max_model_len",
                "long_prefill_token_threshold", "policy", "prefix_caching", "async_scheduling")
"""The ParityConfig fields a case sets (the rest describe make_trace's traces, unused here)."""


@attrs.frozen
class FuzzCase:
    """A scheduler config and a trace, small enough to read and to replay."""

    config: ParityConfig
    pools: tuple[Pool, ...] = ()
    requests: tuple[FuzzRequest, ...] = ()
    name: str = ""
    note: str = ""

    # ------------------------------------------------------------ trace
    def pool_tokens(self, p: int, n: int) -> np.ndarray:
        pool = self.pools[p]
        n = min(n, pool.length)
        if pool.parent is None or pool.fork == 0:
            return _tokens(p, 0, n)
        head = self.pool_tokens(pool.parent, min(pool.fork, n))
        return np.concatenate([head, _tokens(p, head.size, n)])

    def trace(self) -> list[TraceRequest]:
        """The harness trace: ids in arrival order (`r00`, `r01`, ...), so string order is arrival order."""
        width = len(str(max(len(self.requests) - 1, 0)))
        out = []
        for i, r in enumerate(self.requests):
            head = self.pool_tokens(r.pool, r.shared) if r.pool is not None else np.zeros(0, dtype=np.int64)
            tail = _tokens(_UNIQUE_NS + i, head.size, head.size + r.unique)
            prompt = np.concatenate([head, tail])
            out.append(TraceRequest(req_id=r.name or f"r{i:0{width}d}", arrival_step=r.arrival,
                                    prompt_token_ids=tuple(prompt.tolist()), max_tokens=r.max_tokens,
                                    priority=r.priority, abort_step=r.abort_step))
        return out

    def problems(self) -> list[str]:
        """What makes this case fall outside the fuzzed region (empty: valid)."""
        c = self.config
        bad: list[str] = []
        need = -(-c.max_model_len // c.block_size)
        if c.num_blocks - 1 < need:
            bad.append(f"num_blocks={c.num_blocks}: {c.num_blocks - 1} usable blocks cannot hold one "
                       f"max_model_len={c.max_model_len} request ({need} blocks of {c.block_size})")
        if c.max_num_batched_tokens < c.max_num_seqs:
            bad.append(f"max_num_batched_tokens={c.max_num_batched_tokens} < max_num_seqs={c.max_num_seqs} "
                       "(vLLM refuses the config)")
        if c.long_prefill_token_threshold > c.max_model_len:
            bad.append(f"long_prefill_token_threshold={c.long_prefill_token_threshold} > max_model_len")
        arrivals = [r.arrival for r in self.requests]
        if arrivals != sorted(arrivals):
            bad.append("requests are not in arrival order")
        for i, r in enumerate(self.requests):
            where = f"request {i}"
            if r.prompt_len < 1 or r.prompt_len >= c.max_model_len:
                bad.append(f"{where}: prompt of {r.prompt_len} tokens must be 1..max_model_len-1")
            if r.max_tokens < 1:
                bad.append(f"{where}: max_tokens={r.max_tokens} < 1")
            if r.pool is not None and not (0 <= r.pool < len(self.pools) and r.shared <= self.pools[r.pool].length):
                bad.append(f"{where}: pool {r.pool} / shared {r.shared} out of range")
            if r.pool is None and r.shared:
                bad.append(f"{where}: shared tokens without a pool")
            if r.abort_step is not None and r.abort_step < r.arrival:
                bad.append(f"{where}: abort_step {r.abort_step} before arrival {r.arrival}")
            if c.policy == "fcfs" and r.priority:
                bad.append(f"{where}: priority {r.priority} under fcfs")
        names = [r.name for r in self.requests if r.name is not None]
        if len(set(names)) != len(names) or any(not n or (n[0] == "r" and n[1:].isdigit()) for n in names):
            bad.append("request names must be distinct, non-empty and not of the default form r<digits>")
        for p, pool in enumerate(self.pools):
            if pool.parent is not None and not (0 <= pool.parent < p and pool.fork <= self.pools[pool.parent].length):
                bad.append(f"pool {p}: parent {pool.parent} / fork {pool.fork} out of range")
        return bad

    # ------------------------------------------------------------ files
    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "note": self.note,
            "config": {f: getattr(self.config, f) for f in SCHED_FIELDS},
            "pools": [attrs.asdict(p) for p in self.pools],
            "requests": [attrs.asdict(r) for r in self.requests],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "<case>") -> FuzzCase:
        try:
            unknown = set(data["config"]) - set(SCHED_FIELDS)
            if unknown:
                raise ValueError(f"unknown config field(s) {sorted(unknown)}")
            cfg = ParityConfig(**data["config"])
            case = cls(config=cfg, pools=tuple(Pool(**p) for p in data.get("pools", ())),
                       requests=tuple(FuzzRequest(**r) for r in data["requests"]),
                       name=data.get("name", ""), note=data.get("note", ""))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: not a parity case ({type(exc).__name__}: {exc})") from exc
        bad = case.problems()
        if bad:
            raise ValueError(f"{where}: " + "; ".join(bad))
        return case

    def save(self, path: Path) -> None:
        """Write the case as JSON: one request per line, so a diff reads like the trace."""
        d = self.to_json()
        lines = ["{", f'  "name": {json.dumps(d["name"])},', f'  "note": {json.dumps(d["note"])},',
                 f'  "config": {json.dumps(d["config"])},']
        if d["pools"]:
            lines.append('  "pools": [')
            lines += [f"    {json.dumps(p)}{',' if i < len(d['pools']) - 1 else ''}" for i, p in enumerate(d["pools"])]
            lines.append("  ],")
        else:
            lines.append('  "pools": [],')
        lines.append('  "requests": [')
        lines += [f"    {json.dumps(r)}{',' if i < len(d['requests']) - 1 else ''}"
                  for i, r in enumerate(d["requests"])]
        lines += ["  ]", "}"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")

    @classmethod
    def load(cls, path: Path) -> FuzzCase:
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{exc.lineno}:{exc.colno}: not JSON ({exc.msg})") from exc
        return cls.from_json(data, where=str(path))


def load_cases(directory: Path = CASES_DIR) -> list[tuple[Path, FuzzCase]]:
    return [(p, FuzzCase.load(p)) for p in sorted(Path(directory).glob("*.json"))]


# ---------------------------------------------------------------- the generator


@attrs.frozen
class FuzzSize:
    """How big drawn cases get (the CI run draws small ones, the long run larger ones)."""

    max_requests: int = 12
    max_model_lens: tuple[int, ...] = (128, 256, 512, 1024)
    max_output: int = 96
    max_arrival_gap: int = 8


CI_SIZE = FuzzSize()
SMALL_SIZE = FuzzSize(max_requests=8, max_model_lens=(128, 256, 512), max_output=32, max_arrival_gap=4)
"""Fewer, shorter requests: the invariant tests' CI run (the `base` presets verify every step, ~0.3 ms)."""
LONG_SIZE = FuzzSize(max_requests=32, max_model_lens=(128, 256, 512, 1024, 2048), max_output=192, max_arrival_gap=16)
OVERLOAD_SIZE = FuzzSize(max_requests=240, max_model_lens=(128, 256, 512), max_output=48, max_arrival_gap=1)
"""Many requests arriving together: queues past max_num_seqs + 16, where the runtime leaves
waiting requests out of the step (the window fuzz, `parity_fuzz.py --windows --size overload`)."""


def _log_uniform(rng: np.random.Generator, lo: int, hi: int) -> int:
    """An int in [lo, hi], log-uniform (small values as likely per octave as large ones)."""
    if hi <= lo:
        return lo
    return min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


def _length(rng: np.random.Generator, lo: int, hi: int, block_size: int, budget: int) -> int:
    """A token count in [lo, hi]: often right at a block or budget edge (k*bs - 1, k*bs, k*bs + 1,
    the budget +- 1), where off-by-one rules live; else log-uniform."""
    if hi <= lo:
        return lo
    u = rng.random()
    if u < 0.35:
        k = _log_uniform(rng, 1, max(1, hi // block_size))
        n = k * block_size + int(rng.integers(-1, 2))
    elif u < 0.45:
        n = budget + int(rng.integers(-1, 2))
    else:
        n = _log_uniform(rng, lo, hi)
    return min(hi, max(lo, n))


def draw_case(seed: int, size: FuzzSize = CI_SIZE) -> FuzzCase:
    """A random valid case; the same seed gives the same case on any machine.

    Config: block size 16/32/64; max_model_len from `size`; a cache from one max-length
    request (+0 to +100%: tight, preemptions every few steps) to 8x that (ample); a budget
    log-uniform from 1 token to twice the model length; max_num_seqs 1..256 but at most
    the budget (vLLM refuses more); half the cases with a long-prefill threshold; FCFS or
    priority (priorities 0-3); prefix caching on in 3 of 4; async scheduling (two steps in
    flight, output placeholders) in 3 of 10.
    Trace: 1..max_requests requests; bursts (a third arrive with the one before); 0-3 shared
    prefix pools, each maybe forked from an earlier one (70% of prompts start with one, some
    are exactly a pool: identical prompts); prompts and outputs log-uniform
    with extra weight at block and budget edges; 15% of requests aborted 0-24 steps after
    arrival (often mid-prefill or mid-decode); a quarter of the cases with request ids out of
    arrival order.
    """
    rng = np.random.default_rng(seed)
    bs = int(rng.choice([16, 32, 64]))
    mml = int(rng.choice(size.max_model_lens))
    need = -(-mml // bs)
    if rng.random() < 0.5:
        usable = need + int(rng.integers(0, need + 1))  # tight: one max-length request, up to two
    else:
        usable = int(need * math.exp(rng.uniform(math.log(2), math.log(8))))
    budget = _log_uniform(rng, 1, 2 * mml)
    seqs = min(budget, int(rng.choice([1, 2, 3, 4, 6, 8, 16, 64, 256])))
    threshold = _log_uniform(rng, 1, mml) if rng.random() < 0.5 else 0
    policy = "priority" if rng.random() < 0.4 else "fcfs"
    cfg = ParityConfig(block_size=bs, num_blocks=usable + 1, max_num_batched_tokens=budget, max_num_seqs=seqs,
                       max_model_len=mml, long_prefill_token_threshold=threshold, policy=policy,
                       prefix_caching=bool(rng.random() < 0.75),
                       # its own stream, so the cases drawn before async scheduling existed stay the same
                       async_scheduling=bool(np.random.default_rng([seed, 1]).random() < 0.3))
    pools: list[Pool] = []
    for p in range(int(rng.integers(0, 4))):
        length = _length(rng, 1, mml - 1, bs, budget)
        if p and rng.random() < 0.5:
            parent = int(rng.integers(0, p))
            pools.append(Pool(length=length, parent=parent, fork=int(rng.integers(0, pools[parent].length + 1))))
        else:
            pools.append(Pool(length=length))
    requests: list[FuzzRequest] = []
    clock = 0
    count = int(rng.integers(1, size.max_requests + 1))
    # a quarter of the cases name requests out of arrival order (vLLM's priority tie-break is the id)
    names = [f"q{k:03d}" for k in rng.permutation(count)] if rng.random() < 0.25 else [None] * count
    for i in range(count):
        if i and rng.random() >= 1 / 3:
            clock += _log_uniform(rng, 1, size.max_arrival_gap)
        prompt = _length(rng, 1, mml - 1, bs, budget)
        pool, shared = None, 0
        if pools and rng.random() < 0.7:
            pool = int(rng.integers(0, len(pools)))
            shared = min(prompt, pools[pool].length)
            if rng.random() < 0.4:  # stop part-way into the pool: a prefix of random depth
                shared = int(rng.integers(0, shared + 1))
            elif rng.random() < 0.3:  # the whole pool and nothing else: identical prompts
                prompt = shared = pools[pool].length
            if shared == 0:
                pool = None
        out = _length(rng, 1, size.max_output, bs, budget)
        priority = int(rng.integers(0, 4)) if policy == "priority" else 0
        abort = clock + int(rng.integers(0, 25)) if rng.random() < 0.15 else None
        requests.append(FuzzRequest(arrival=clock, unique=prompt - shared, max_tokens=out, pool=pool, shared=shared,
                                    priority=priority, abort_step=abort, name=names[i]))
    case = FuzzCase(config=cfg, pools=tuple(pools), requests=tuple(requests), name=f"seed-{seed}")
    bad = case.problems()
    assert not bad, f"draw_case({seed}) drew an invalid case: {bad}"
    return case


# ---------------------------------------------------------------- running a case

Driver = Callable[[ParityConfig, Sequence[TraceRequest]], list[StepRecord]]


@attrs.frozen
class Outcome:
    """Both schedulers on one case: the comparison, or why one side did not finish."""

    report: ParityReport | None
    steps: int
    problem: str | None
    """None: identical decisions. Else the first divergence, a crash or a stall, in words."""
    vllm_error: str | None = None
    """vLLM itself failed (a region the fuzzer must avoid): not schedir's divergence."""
    features: frozenset[str] = frozenset()
    """The rare rules vLLM's run went through (`features`)."""

    @property
    def diverged(self) -> bool:
        return self.problem is not None and self.vllm_error is None


def _run(driver: Driver, cfg: ParityConfig, trace: Sequence[TraceRequest]) -> tuple[list[StepRecord] | None, str | None]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", EngineStalled)
        try:
            records = driver(cfg, trace)
        except Exception as exc:  # noqa: BLE001 - a crash is a finding, named with its type and message
            return None, f"{type(exc).__name__}: {exc}"
    stalls = [str(w.message) for w in caught if issubclass(w.category, EngineStalled)]
    return records, (f"stalled: {stalls[0]}" if stalls else None)


def run_case(case: FuzzCase, vllm_driver: Driver, schedir_driver: Driver = drive_schedir) -> Outcome:
    """Run vLLM's scheduler and schedir's on `case` and compare every step."""
    trace = case.trace()
    cfg = case.config
    a, a_err = _run(vllm_driver, cfg, trace)
    if a is None or a_err:
        return Outcome(None, len(a or ()), f"vLLM: {a_err}", vllm_error=a_err)
    b, b_err = _run(schedir_driver, cfg, trace)
    if b is None:
        return Outcome(None, len(a), f"schedir crashed: {b_err}")
    report = compare(a, b)
    seen = frozenset(features(case, a))
    if b_err and report.decisions_identical:
        return Outcome(report, len(a), f"schedir {b_err}", features=seen)
    return Outcome(report, len(a), None if report.decisions_identical else report.first_divergence, features=seen)


# ---------------------------------------------------------------- what a case exercised


def features(case: FuzzCase, records: Sequence[StepRecord]) -> set[str]:
    """The rare rules a run went through, read from its step records (the run's coverage):

    - `preemption` / `priority-preemption`: a request preempted (under the priority policy);
    - `resume-with-hit`: a preempted request resumed from a prefix-cache hit;
    - `same-step-hit`: a request admitted onto blocks another request got in the same step;
    - `full-prompt-hit`: a hit covering every full block of the prompt but the last token's;
    - `abort-waiting` / `abort-mid-prefill` / `abort-mid-decode` / `abort-preempted`: where an
      aborted request was when its abort came;
    - `long-prefill-cap`: a chunk cut to long_prefill_token_threshold;
    - `max-num-seqs`: a step with max_num_seqs requests while another one waited;
    - `model-len-cut`: a generation stopped by max_model_len before max_tokens.
    """
    c = case.config
    trace = {r.req_id: r for r in case.trace()}
    got: set[str] = set()
    done: dict[str, int] = {}  # tokens scheduled so far
    preempted_now: set[str] = set()
    finished_at: dict[str, int] = {}
    state_at_abort: dict[str, str] = {}
    aborts = {rid: r.abort_step for rid, r in trace.items() if r.abort_step is not None}
    for rec in records:
        for rid, at in aborts.items():
            if rid not in state_at_abort and at <= rec.step and rid in trace and trace[rid].arrival_step <= rec.step:
                n, p = done.get(rid, 0), len(trace[rid].prompt_token_ids)
                last = min(p + trace[rid].max_tokens, c.max_model_len) - 1  # tokens computed when it ends
                state_at_abort[rid] = ("preempted" if rid in preempted_now else "waiting" if n == 0
                                       else "mid-prefill" if n < p else "mid-decode" if n < last else "done")
        for rid in rec.finished:
            finished_at.setdefault(rid, rec.step)
        if rec.preempted:
            got.add("priority-preemption" if c.policy == "priority" else "preemption")
            preempted_now |= rec.preempted
            for rid in rec.preempted:
                done[rid] = 0
        given: set[int] = set()
        for rid, blocks in rec.new_block_ids + rec.cached_new_block_ids:
            if given & set(blocks):
                got.add("same-step-hit")
            given |= set(blocks)
        for rid, n, hit in rec.new:
            p = len(trace[rid].prompt_token_ids)
            if hit and hit == (p - 1) // c.block_size * c.block_size:
                got.add("full-prompt-hit")
        for rid, n, resumed, computed in rec.cached:
            if resumed:
                preempted_now.discard(rid)
                if computed:
                    got.add("resume-with-hit")
        scheduled = [(e[0], e[1], e[2]) for e in rec.new] + [(e[0], e[1], e[3]) for e in rec.cached]
        for rid, n, start in scheduled:
            done[rid] = max(done.get(rid, 0), start) + n
            if 0 < c.long_prefill_token_threshold == n and done[rid] < len(trace[rid].prompt_token_ids):
                got.add("long-prefill-cap")
        if len(scheduled) == c.max_num_seqs:
            waiting = [rid for rid, r in trace.items() if r.arrival_step <= rec.step and rid not in finished_at
                       and rid not in {e[0] for e in scheduled}]
            if waiting:
                got.add("max-num-seqs")
    for rid, where in state_at_abort.items():
        if where != "done" and finished_at.get(rid, -1) >= aborts[rid]:
            got.add(f"abort-{where}")
    for rid, r in trace.items():
        if rid not in aborts and len(r.prompt_token_ids) + r.max_tokens > c.max_model_len:
            got.add("model-len-cut")
    return got


FEATURES = ("preemption", "priority-preemption", "resume-with-hit", "same-step-hit", "full-prompt-hit",
            "abort-waiting", "abort-mid-prefill", "abort-mid-decode", "abort-preempted", "long-prefill-cap",
            "max-num-seqs", "model-len-cut")


# ---------------------------------------------------------------- shrinking


def _candidates(case: FuzzCase) -> Iterator[FuzzCase]:
    """Simpler neighbours of `case`, roughly most-simplifying first."""
    reqs = list(case.requests)
    n = len(reqs)
    ev = attrs.evolve
    # fewer requests: halves, quarters, ... then one at a time (from the back: later ones matter less)
    chunk = n // 2
    while chunk >= 1:
        for start in range(0, n, chunk):
            kept = reqs[:start] + reqs[start + chunk:]
            if kept:
                yield ev(case, requests=tuple(kept))
        chunk //= 2
    if any(r.name is not None for r in reqs):
        yield ev(case, requests=tuple(ev(r, name=None) for r in reqs))
    # simpler config
    c = case.config
    if c.long_prefill_token_threshold:
        yield ev(case, config=ev(c, long_prefill_token_threshold=0))
    if c.policy == "priority":
        yield ev(case, config=ev(c, policy="fcfs"), requests=tuple(ev(r, priority=0) for r in reqs))
    if c.prefix_caching:
        yield ev(case, config=ev(c, prefix_caching=False))
    if c.max_num_seqs < 256:
        yield ev(case, config=ev(c, max_num_seqs=min(256, c.max_num_batched_tokens)))
    if c.max_num_batched_tokens < 2 * c.max_model_len:
        yield ev(case, config=ev(c, max_num_batched_tokens=2 * c.max_model_len))
    if c.num_blocks - 1 < 8 * -(-c.max_model_len // c.block_size):
        yield ev(case, config=ev(c, num_blocks=8 * -(-c.max_model_len // c.block_size) + 1))
    # per-request simplifications
    for i, r in enumerate(reqs):
        def put(new: FuzzRequest, i: int = i) -> FuzzCase:
            return ev(case, requests=tuple(reqs[:i] + [new] + reqs[i + 1:]))
        if r.abort_step is not None:
            yield put(ev(r, abort_step=None))
        if r.priority:
            yield put(ev(r, priority=0))
        if r.pool is not None:
            yield put(ev(r, pool=None, shared=0, unique=r.prompt_len))
        for m in sorted({1, r.max_tokens // 2, r.max_tokens - 1} - {r.max_tokens}):
            if m >= 1:
                yield put(ev(r, max_tokens=m))
        for u in sorted({0 if r.shared else 1, r.unique // 2, r.unique - 1} - {r.unique}):
            if u >= 0 and u + r.shared >= 1:
                yield put(ev(r, unique=u))
        for s in sorted({0, r.shared // 2, r.shared - 1} - {r.shared}):
            if r.pool is not None and s >= 0 and s + r.unique >= 1:
                yield put(ev(r, shared=s, pool=r.pool if s else None))
        if r.abort_step is not None and r.abort_step > r.arrival:
            yield put(ev(r, abort_step=r.arrival + (r.abort_step - r.arrival) // 2))
    # earlier arrivals: close the gaps
    for i in range(1, n):
        gap = reqs[i].arrival - reqs[i - 1].arrival
        if gap > 0:
            shift = gap - gap // 2 if gap > 1 else 1
            moved = [ev(r, arrival=r.arrival - shift,
                        abort_step=None if r.abort_step is None else r.abort_step - shift) if j >= i else r
                     for j, r in enumerate(reqs)]
            yield ev(case, requests=tuple(moved))
    if n and reqs[0].arrival > 0:
        s = reqs[0].arrival
        yield ev(case, requests=tuple(ev(r, arrival=r.arrival - s,
                                         abort_step=None if r.abort_step is None else r.abort_step - s)
                                      for r in reqs))
    # smaller model length and cache (keeping every request valid)
    if c.max_model_len > 64:
        longest = max(r.prompt_len for r in reqs) if reqs else 1
        m = max(longest + 1, c.max_model_len // 2)
        if m < c.max_model_len:
            need = -(-m // c.block_size)
            yield ev(case, config=ev(c, max_model_len=m, num_blocks=max(need + 1, min(c.num_blocks, 4 * need + 1)),
                                     long_prefill_token_threshold=min(c.long_prefill_token_threshold, m)))
    # unused pools
    used = {r.pool for r in reqs} | {p.parent for p in case.pools}
    if case.pools and (len(case.pools) - 1) not in used:
        yield ev(case, pools=case.pools[:-1])


def shrink(case: FuzzCase, still_fails: Callable[[FuzzCase], bool], max_tries: int = 2000,
           max_seconds: float = 120.0) -> tuple[FuzzCase, int]:
    """Greedy delta debugging: take the first simpler neighbour that still fails, repeat until
    none does (or the try / time budget runs out). Returns (smallest case, tries)."""
    tries = 0
    deadline = time.monotonic() + max_seconds
    seen = {case}  # some simplifications undo others (a smaller model length, a larger cache): never revisit
    improved = True
    while improved and tries < max_tries and time.monotonic() < deadline:
        improved = False
        for cand in _candidates(case):
            if cand in seen or cand.problems():
                continue
            seen.add(cand)
            tries += 1
            if still_fails(cand):
                case = cand
                improved = True
                break
            if tries >= max_tries or time.monotonic() >= deadline:
                break
    return case, tries


# ---------------------------------------------------------------- a fuzzing session


@attrs.define
class FuzzTally:
    cases: int = 0
    steps: int = 0
    divergent: int = 0
    vllm_errors: int = 0
    seconds: float = 0.0
    coverage: dict[str, int] = attrs.Factory(dict)
    """Cases whose vLLM run went through each rare rule (`FEATURES`)."""
    found: list[tuple[int, str, Path | None]] = attrs.Factory(list)
    """(seed, first divergence of the shrunk case, regression file) per divergent case kept."""

    @property
    def cases_per_s(self) -> float:
        return self.cases / self.seconds if self.seconds else 0.0


def fuzz(seeds: Sequence[int], vllm_driver: Driver, *, size: FuzzSize = CI_SIZE, save_dir: Path | None = None,
         shrink_found: bool = True, max_saved: int = 5, on_case: Callable[[int, Outcome], None] | None = None,
         schedir_driver: Driver = drive_schedir) -> FuzzTally:
    """Run one case per seed; shrink each divergent one and (with `save_dir`) save it as
    `fuzz-<seed>.json`, up to `max_saved` files per session."""
    tally = FuzzTally()
    start = time.perf_counter()
    for seed in seeds:
        case = draw_case(seed, size)
        outcome = run_case(case, vllm_driver, schedir_driver)
        tally.cases += 1
        tally.steps += outcome.steps
        for f in outcome.features:
            tally.coverage[f] = tally.coverage.get(f, 0) + 1
        if outcome.vllm_error is not None:
            tally.vllm_errors += 1
        elif outcome.diverged:
            tally.divergent += 1
            small = case
            if shrink_found:
                small, _ = shrink(case, lambda c: run_case(c, vllm_driver, schedir_driver).diverged)
            why = run_case(small, vllm_driver, schedir_driver).problem or outcome.problem or ""
            path = None
            if save_dir is not None and len(tally.found) < max_saved:
                path = Path(save_dir) / f"fuzz-{seed}.json"
                attrs.evolve(small, name=f"fuzz-{seed}", note=why.splitlines()[0]).save(path)
            tally.found.append((seed, why, path))
        if on_case is not None:
            on_case(seed, outcome)
    tally.seconds = time.perf_counter() - start
    return tally


def build_corpus(seeds: Sequence[int], vllm_driver: Driver, save_dir: Path = CASES_DIR, *,
                 size: FuzzSize = CI_SIZE, wanted: Sequence[str] = FEATURES,
                 schedir_driver: Driver = drive_schedir, max_seconds: float = 60.0) -> dict[str, Path]:
    """One minimal regression case per rare rule (`FEATURES`): the first seed whose vLLM run goes
    through the rule, shrunk while vLLM still goes through it and schedir still agrees, saved as
    `corpus-<rule>.json`. These keep the interleavings the fuzzer reached replayed in every test
    run, divergent or not (divergent cases are saved as `fuzz-<seed>.json` by `fuzz`)."""
    saved: dict[str, Path] = {}
    todo = [f for f in wanted if not (Path(save_dir) / f"corpus-{f}.json").exists()]
    for seed in seeds:
        if not todo:
            break
        case = draw_case(seed, size)
        got = features(case, vllm_driver(case.config, case.trace()))
        for feature in [f for f in todo if f in got]:

            def keeps(c: FuzzCase, feature: str = feature) -> bool:
                trace = c.trace()
                a = vllm_driver(c.config, trace)
                return feature in features(c, a) and compare(a, schedir_driver(c.config, trace)).decisions_identical

            if not keeps(case):
                continue  # a divergence: `fuzz` reports and keeps it
            small, _ = shrink(case, keeps, max_seconds=max_seconds)
            path = Path(save_dir) / f"corpus-{feature}.json"
            attrs.evolve(small, name=f"corpus-{feature}",
                         note=f"corpus: {feature} (seed {seed}, shrunk); vLLM and schedir agree").save(path)
            saved[feature] = path
            todo.remove(feature)
    return saved
