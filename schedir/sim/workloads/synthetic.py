"""Synthetic multi-turn workloads whose defaults look like Mooncake's conversation trace.

The traces are not ours to ship, so this generator is the built-in workload. Its
model, in the order `generate` applies it:

- Conversations start by a Poisson process (or a bursty gamma renewal process);
  each is "casual" or "engaged" (a per-kind probability of one more turn), has
  a priority class, and uses one of `num_system_prompts` shared system prompts.
- Turn 0's prompt = system prompt + user text. Turn k's prompt = turn k-1's
  prompt + its output + new user text, so turn k shares every full 512-token
  block of turn k-1's prompt; the partial last block is new content (as in
  Mooncake, where only full blocks keep their hash). Turns are a think time apart.
- Block ids are chain-unique like Mooncake's: the system prompt's full blocks
  are shared by every conversation, every other block is fresh where it first
  appears and inherited after that.
- Conversations end early once a prompt would exceed `max_input_len`. Requests
  are taken in arrival order, then arrivals are rescaled to exactly `rate`.

Everything is vectorised numpy: 12k requests take a few tens of milliseconds.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from schedir.sim.workloads.workload import Workload, blocks_for


def _probabilities(weights: tuple[float, ...]) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    return w / w.sum()


def _check_weights(_: object, attribute: attrs.Attribute, value: tuple[float, ...]) -> None:
    if not value or any(not (w >= 0 and math.isfinite(w)) for w in value) or sum(value) <= 0:
        raise ValueError(f"{attribute.name} must be non-negative weights with a positive sum, got {value}")


@attrs.frozen
class LogNormalMix:
    """Token counts from a mixture of lognormals (each given by median and sigma), rounded, clipped to [low, high]."""

    medians: tuple[float, ...] = attrs.field(converter=tuple)
    sigmas: tuple[float, ...] = attrs.field(converter=tuple)
    weights: tuple[float, ...] = attrs.field(default=(1.0,), converter=tuple, validator=_check_weights)
    low: int = 1
    high: int = 1 << 20

    def __attrs_post_init__(self) -> None:
        if not (len(self.medians) == len(self.sigmas) == len(self.weights)):
            raise ValueError("medians, sigmas and weights must have one entry per component")
        if any(m <= 0 for m in self.medians) or any(s < 0 for s in self.sigmas):
            raise ValueError("medians must be > 0 and sigmas >= 0")
        if not 1 <= self.low <= self.high:
            raise ValueError(f"need 1 <= low <= high, got {self.low}, {self.high}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        component = rng.choice(len(self.weights), size=n, p=_probabilities(self.weights))
        mu = np.log(np.asarray(self.medians))[component]
        x = np.exp(mu + np.asarray(self.sigmas)[component] * rng.standard_normal(n))
        return np.clip(np.rint(x), self.low, self.high).astype(np.int64)


# Fitted by `python benchmarks/workload_stats.py --fit` to Mooncake's conversation trace
# (12,031 requests): turns per conversation to the trace's multi-turn chain depths
# (0.31, 0.13, 0.066, 0.039, ... requests at depth 1, 2, 3, 4, ... per conversation),
# outputs to its quantiles, prompts through the whole generator to its input quantiles
# and prefix-hit fraction. 12,031 requests, seed 0, give input p50/p90/p99 6,758 / 28,859 /
# 81,001 (trace: 6,909 / 27,367 / 85,400), output p50/p90/p99 350 / 595 / 1,128 (350 / 597 /
# 1,119) and 38.4% prefix-hit tokens (37.4%); seeds 0-5 at 12,000 give 37.3-39.6%.
MOONCAKE_SYSTEM_PROMPT = 890  # the trace's shortest prompts are 891-905 tokens; all share block 0
MOONCAKE_FIRST_TURN = LogNormalMix(medians=(39.2, 8807.0), sigmas=(1.342, 1.049), weights=(0.261, 0.739), high=125_000)
MOONCAKE_FOLLOW_UP = LogNormalMix(medians=(35.2, 236.6), sigmas=(0.985, 1.155), weights=(0.675, 0.325), high=100_000)
MOONCAKE_OUTPUT = LogNormalMix(medians=(39.8, 405.4, 444.2), sigmas=(1.388, 0.298, 0.630),
                               weights=(0.293, 0.605, 0.102), high=2000)


@attrs.frozen
class SyntheticSpec:
    """Every knob of the generator; the defaults reproduce Mooncake's conversation trace."""

    num_requests: int = attrs.field(default=12_000, validator=attrs.validators.ge(1))
    rate: float = 3.4
    arrival: str = attrs.field(default="poisson", validator=attrs.validators.in_(("poisson", "bursty")))
    burst_cv: float = 3.0  # coefficient of variation of gaps between conversation starts when bursty
    system_prompt_tokens: int = attrs.field(default=MOONCAKE_SYSTEM_PROMPT, validator=attrs.validators.ge(0))
    num_system_prompts: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    first_turn: LogNormalMix = MOONCAKE_FIRST_TURN  # user text of turn 0, after the system prompt
    follow_up: LogNormalMix = MOONCAKE_FOLLOW_UP  # new user text of each later turn
    output: LogNormalMix = MOONCAKE_OUTPUT
    continue_probs: tuple[float, ...] = attrs.field(default=(0.295, 0.742), converter=tuple)
    continue_weights: tuple[float, ...] = attrs.field(default=(0.905, 0.095), converter=tuple, validator=_check_weights)
    max_turns: int = attrs.field(default=64, validator=attrs.validators.ge(1))
    think_median_s: float = 123.0  # the trace's median gap between a turn and the next: 123 s (p10 42, p90 483)
    think_sigma: float = 1.0
    max_input_len: int = attrs.field(default=126_000, validator=attrs.validators.ge(2))
    warm_up_s: float = attrs.field(default=1800.0, validator=attrs.validators.ge(0))  # see generate()
    priority_weights: tuple[float, ...] = attrs.field(default=(1.0,), converter=tuple, validator=_check_weights)
    block_tokens: int = attrs.field(default=512, validator=attrs.validators.ge(1))
    seed: int = 0
    name: str = "synthetic"

    def __attrs_post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate must be a positive finite number, got {self.rate}")
        if self.arrival == "bursty" and not self.burst_cv > 0:
            raise ValueError(f"burst_cv must be > 0, got {self.burst_cv}")
        if len(self.continue_probs) != len(self.continue_weights):
            raise ValueError("continue_probs and continue_weights must have one entry per conversation kind")
        if any(not 0 <= p < 1 for p in self.continue_probs):
            raise ValueError(f"continue_probs must be in [0, 1), got {self.continue_probs}")
        if self.system_prompt_tokens >= self.max_input_len:
            raise ValueError("system_prompt_tokens must leave room for user text below max_input_len")

    def mean_turns(self) -> float:
        return float(_probabilities(self.continue_weights) @ (1.0 / (1.0 - np.asarray(self.continue_probs))))


def _segment_cumsum(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Cumulative sums that restart wherever `first` is True (conversations are contiguous)."""
    total = np.cumsum(values)
    start = np.flatnonzero(first)
    base = total[start] - values[start]
    return total - np.repeat(base, np.diff(np.append(start, len(values))))


def _conversation_starts(spec: SyntheticSpec, rng: np.random.Generator, count: int) -> np.ndarray:
    mean_gap = spec.mean_turns() / spec.rate
    if spec.arrival == "poisson":
        gaps = rng.exponential(mean_gap, size=count)
    else:
        shape = 1.0 / spec.burst_cv**2
        gaps = rng.gamma(shape, mean_gap / shape, size=count)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def _block_ids(conv: np.ndarray, first: np.ndarray, input_len: np.ndarray, system: np.ndarray,
               spec: SyntheticSpec) -> tuple[np.ndarray, np.ndarray]:
    """Chain-unique block ids for requests in conversation order (offsets, ids)."""
    bt = spec.block_tokens
    sys_blocks = spec.system_prompt_tokens // bt
    counts = blocks_for(input_len, bt)
    shared = np.where(first, sys_blocks, np.concatenate(([0], input_len[:-1] // bt)))
    fresh_base = spec.num_system_prompts * sys_blocks + np.concatenate(([0], np.cumsum(counts - shared)[:-1]))
    offsets = np.concatenate(([0], np.cumsum(counts)))
    req = np.repeat(np.arange(len(input_len)), counts)
    pos = np.arange(offsets[-1]) - offsets[req]
    origin = req.copy()
    inherited = (pos < shared[req]) & (pos >= sys_blocks)
    stride = int(counts.max()) + 1
    keys = conv * stride + shared  # sorted: conversations are contiguous and `shared` grows turn by turn
    origin[inherited] = np.searchsorted(keys, conv[req[inherited]] * stride + pos[inherited], side="right") - 1
    ids = fresh_base[origin] + pos - shared[origin]
    in_system = pos < sys_blocks
    ids[in_system] = system[req[in_system]] * sys_blocks + pos[in_system]
    return offsets, ids


@attrs.frozen
class _Requests:
    """Sampled requests in conversation order (contiguous conversations, turns ascending)."""

    conv: np.ndarray
    first: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    arrival: np.ndarray
    priority: np.ndarray
    system: np.ndarray


def _sample(spec: SyntheticSpec, rng: np.random.Generator, num_conv: int) -> _Requests:
    kind = rng.choice(len(spec.continue_probs), size=num_conv, p=_probabilities(spec.continue_weights))
    turns = np.minimum(rng.geometric(1.0 - np.asarray(spec.continue_probs)[kind]), spec.max_turns)
    conv = np.repeat(np.arange(num_conv), turns)
    first = np.zeros(len(conv), dtype=bool)
    first[np.concatenate(([0], np.cumsum(turns)[:-1]))] = True
    total = len(conv)

    text = np.empty(total, dtype=np.int64)
    text[first] = spec.first_turn.sample(rng, int(first.sum()))
    text[~first] = spec.follow_up.sample(rng, int((~first).sum()))
    output = spec.output.sample(rng, total)
    growth = text + np.where(first, spec.system_prompt_tokens, np.concatenate(([0], output[:-1])))
    input_len = _segment_cumsum(growth, first)
    input_len[first] = np.minimum(input_len[first], spec.max_input_len)

    think = np.where(first, 0.0, spec.think_median_s * np.exp(spec.think_sigma * rng.standard_normal(total)))
    starts = _conversation_starts(spec, rng, num_conv) - spec.warm_up_s
    arrival = starts[conv] + _segment_cumsum(think, first)
    priority = rng.choice(len(spec.priority_weights), size=num_conv, p=_probabilities(spec.priority_weights))
    system = rng.integers(0, spec.num_system_prompts, size=num_conv)
    keep = input_len <= spec.max_input_len  # prompts only grow within a conversation: this ends it early
    return _Requests(conv[keep], first[keep], input_len[keep], output[keep], arrival[keep],
                     priority[conv[keep]], system[conv[keep]])


def generate(spec: SyntheticSpec = SyntheticSpec()) -> Workload:
    """`spec.num_requests` requests in arrival order, arrivals rescaled to exactly `spec.rate` req/s."""
    rng = np.random.default_rng(spec.seed)
    n = spec.num_requests
    num_conv = int((n + spec.warm_up_s * spec.rate) / spec.mean_turns() * 1.25) + 16
    while True:
        req = _sample(spec, rng, num_conv)
        if np.count_nonzero(req.arrival >= 0) >= n:
            break
        num_conv *= 2
    offsets, ids = _block_ids(req.conv, req.first, req.input_len, req.system, spec)

    order = np.argsort(req.arrival, kind="stable")
    order = order[req.arrival[order] >= 0][:n]  # turns before the window are content the window never saw
    counts = np.diff(offsets)[order]
    new_offsets = np.concatenate(([0], np.cumsum(counts)))
    gather = np.repeat(offsets[order] - new_offsets[:-1], counts) + np.arange(new_offsets[-1])
    workload = Workload(name=spec.name, source=f"generate({spec!r})", arrival_s=req.arrival[order] - req.arrival[order[0]],
                        input_len=req.input_len[order], output_len=req.output_len[order],
                        priority=req.priority[order], block_offsets=new_offsets, block_ids=ids[gather],
                        block_tokens=spec.block_tokens)
    return workload.with_rate(spec.rate) if workload.duration_s > 0 else workload
