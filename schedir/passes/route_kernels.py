"""What the routing passes share: sequential choice kernels, the link model, cost estimates.

Routing a batch of arrivals is sequential in one respect only: a request routed to an
instance adds to its load before the next one is placed. The kernels below do that loop in
Numba over plain arrays (one pass over the batch, one scan over the instances per request),
so a routing step costs the same few numpy calls whatever the batch size.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numba as nb
import numpy as np

from schedir.ir.route_pass import RoutePass
from schedir.ir.route_step import RouteView

# Llama-3-8B in fp16: 2 (K and V) x 32 layers x 8 KV heads x 128 dims x 2 bytes
LLAMA3_8B_KV_BYTES_PER_TOKEN = 131072


@nb.njit(cache=True)
def least_load_kernel(load: np.ndarray, eligible: np.ndarray, count: int) -> np.ndarray:
    """For `count` requests in order: the eligible instance with the least load (ties: the
    first), which then carries one more request. -1 when no instance is eligible."""
    out = np.full(count, -1, dtype=np.int64)
    load = load.copy()
    for i in range(count):
        best = -1
        for j in range(load.size):
            if eligible[j] and (best < 0 or load[j] < load[best]):
                best = j
        out[i] = best
        if best >= 0:
            load[best] += 1
    return out


@nb.njit(cache=True)
def cache_aware_kernel(hits: np.ndarray, prompt: np.ndarray, load: np.ndarray, eligible: np.ndarray,
                       block_tokens: int, hit_threshold: float, overload_ratio: float,
                       overload_slack: float) -> tuple[np.ndarray, np.ndarray]:
    """Mooncake Conductor's choice per request, in order: the instance holding the longest
    cached prefix (ties: the least loaded) if that prefix covers at least `hit_threshold` of
    the prompt and the instance is not overloaded (load <= ratio x least load + slack), else
    the least loaded instance. Returns (instance row, 1 if chosen for its cache)."""
    n = hits.shape[0]
    out = np.full(n, -1, dtype=np.int64)
    by_cache = np.zeros(n, dtype=np.int64)
    load = load.copy()
    for i in range(n):
        best = -1
        least = -1
        for j in range(load.size):
            if not eligible[j]:
                continue
            if least < 0 or load[j] < load[least]:
                least = j
            if best < 0 or hits[i, j] > hits[i, best] or (hits[i, j] == hits[i, best] and load[j] < load[best]):
                best = j
        if least < 0:
            continue
        pick = least
        if hits[i, best] > 0:
            ratio = min(1.0, hits[i, best] * block_tokens / max(prompt[i], 1))
            if ratio >= hit_threshold and load[best] <= overload_ratio * load[least] + overload_slack:
                pick = best
                by_cache[i] = 1
        out[i] = pick
        load[pick] += 1
    return out, by_cache


@nb.njit(cache=True)
def cache_balance_kernel(hits: np.ndarray, prompt: np.ndarray, load: np.ndarray, tree: np.ndarray,
                         eligible: np.ndarray, block_tokens: int, cache_threshold: float, abs_threshold: float,
                         rel_threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """The SGLang router's cache-aware rule per request, in order: when the fleet is
    imbalanced (max load - min load > abs and max load > rel x min load) the least loaded
    instance; else the best prefix match if its match rate exceeds `cache_threshold`; else
    the instance with the smallest tree (`tree`: cached prefix blocks; ties: the least loaded).
    Returns (row, 1 if by cache)."""
    n = hits.shape[0]
    out = np.full(n, -1, dtype=np.int64)
    by_cache = np.zeros(n, dtype=np.int64)
    load = load.copy()
    for i in range(n):
        least = -1
        most = -1
        best = -1
        roomy = -1
        for j in range(load.size):
            if not eligible[j]:
                continue
            if least < 0 or load[j] < load[least]:
                least = j
            if most < 0 or load[j] > load[most]:
                most = j
            if best < 0 or hits[i, j] > hits[i, best] or (hits[i, j] == hits[i, best] and load[j] < load[best]):
                best = j
            if roomy < 0 or tree[j] < tree[roomy] or (tree[j] == tree[roomy] and load[j] < load[roomy]):
                roomy = j
        if least < 0:
            continue
        imbalanced = (load[most] - load[least] > abs_threshold) and (load[most] > rel_threshold * load[least])
        if imbalanced:
            pick = least
        else:
            rate = min(1.0, hits[i, best] * block_tokens / max(prompt[i], 1))
            if hits[i, best] > 0 and rate > cache_threshold:
                pick = best
                by_cache[i] = 1
            else:
                pick = roomy
        out[i] = pick
        load[pick] += 1
        tree[pick] += prompt[i] // block_tokens
    return out, by_cache


@nb.njit(cache=True)
def slo_miss_kernel(prompt: np.ndarray, hits: np.ndarray, queued_tokens: np.ndarray, running: np.ndarray,
                    role: np.ndarray, ttft_slo_ms: np.ndarray, tbt_slo_ms: np.ndarray, slack: float,
                    block_tokens: int, prefill_per_us: float, decode_us: float, per_running_us: float,
                    prefill_role: int, decode_role: int) -> np.ndarray:
    """slo-early-reject's prediction per request (one call, not a dozen numpy ones on 1 x m
    arrays): best TTFT over the instances that prefill, best TBT over those that decode; True
    where either misses its SLO (x `slack`; an SLO of 0 is none). Same arithmetic, same order,
    as the formulas in the pass's docstring, so the same floats."""
    k = hits.shape[0]
    tbt = best_tbt_ms(running, role, decode_us, per_running_us, prefill_role)
    miss = np.zeros(k, dtype=np.bool_)
    for i in range(k):
        ttft = best_ttft_ms(prompt[i], hits, i, queued_tokens, role, block_tokens, prefill_per_us, decode_role)
        miss[i] = slo_missed(ttft, tbt, ttft_slo_ms[i], tbt_slo_ms[i], slack)
    return miss


@nb.njit(cache=True)
def best_tbt_ms(running: np.ndarray, role: np.ndarray, decode_us: float, per_running_us: float,
                prefill_role: int) -> float:
    """The least predicted decode step (ms) over the instances that decode: a step at their
    running batch + 1. The division is monotone, so it is taken once, of the least numerator
    (the same float as the least quotient)."""
    best = np.inf
    for j in range(running.size):
        if role[j] != prefill_role:
            t = decode_us + per_running_us * (running[j] + 1)
            if t < best:
                best = t
    return best / 1e3


@nb.njit(cache=True)
def best_ttft_ms(prompt: int, hits: np.ndarray, i: int, queued_tokens: np.ndarray, role: np.ndarray,
                 block_tokens: int, prefill_per_us: float, decode_role: int) -> float:
    """The least predicted TTFT (ms) of request row i over the instances that prefill: tokens
    queued there plus its uncached tokens, at the prefill rate (divided once, as above)."""
    best = -1
    for j in range(queued_tokens.size):
        if role[j] != decode_role:
            tokens = queued_tokens[j] + max(prompt - hits[i, j] * block_tokens, 1)
            if best < 0 or tokens < best:
                best = tokens
    if best < 0:
        return np.inf
    return best / prefill_per_us / 1e3


@nb.njit(cache=True)
def slo_missed(ttft: float, tbt: float, ttft_slo_ms: int, tbt_slo_ms: int, slack: float) -> bool:
    """True where either prediction misses its SLO (x `slack`; an SLO of 0 is none)."""
    ttft_slo = float(ttft_slo_ms) * slack
    tbt_slo = float(tbt_slo_ms) * slack
    return (ttft_slo > 0 and ttft > ttft_slo) or (tbt_slo > 0 and tbt > tbt_slo)


@nb.njit(cache=True)
def one_move_us(src_pos: int, dst_pos: int, nbytes: int, intra_gbs: float, inter_gbs: float, intra_latency_us: float,
            inter_latency_us: float) -> float:
    """The link model for one move: latency (intra, or inter x positions apart) + bytes / bandwidth."""
    dist = abs(src_pos - dst_pos)
    if dist == 0:
        return intra_latency_us + np.float64(nbytes) / (intra_gbs * 1e3)
    return inter_latency_us * max(dist, 1) + np.float64(nbytes) / (inter_gbs * 1e3)


@nb.njit(cache=True)
def _moves_us(src_pos: np.ndarray, dst_pos: np.ndarray, nbytes: np.ndarray, intra_gbs: float, inter_gbs: float,
              intra_latency_us: float, inter_latency_us: float) -> np.ndarray:
    out = np.empty(src_pos.size, dtype=np.float64)
    for i in range(src_pos.size):
        out[i] = one_move_us(src_pos[i], dst_pos[i], nbytes[i], intra_gbs, inter_gbs, intra_latency_us,
                             inter_latency_us)
    return out


@nb.njit(cache=True)
def pull_one(hits: np.ndarray, i: int, at: int, position: np.ndarray, block_tokens: int, kv_bytes_per_token: int,
             intra_gbs: float, inter_gbs: float, intra_latency_us: float, inter_latency_us: float,
             prefill_per_us: float) -> tuple[int, int, float, int]:
    """topology-distance's test for one routed request (row i of `hits`, routed to column `at`):
    the nearest instance with the longest hit as the source, and whether moving the extra blocks
    over the link (`one_move_us`) beats recomputing them. Returns (source column, bytes, gain µs,
    the longest hit); source -1 where nothing moves."""
    m = hits.shape[1]
    have = hits[i, at]
    best = hits[i, 0]
    for j in range(1, m):
        if hits[i, j] > best:
            best = hits[i, j]
    if best <= have:
        return -1, 0, 0.0, best
    here = position[at]
    pick = -1
    near = 0
    for j in range(m):
        if hits[i, j] == best:
            d = abs(position[j] - here)
            if pick < 0 or d < near:
                pick = j
                near = d
    extra = best - have
    size = extra * block_tokens * kv_bytes_per_token
    move = one_move_us(position[pick], here, size, intra_gbs, inter_gbs, intra_latency_us, inter_latency_us)
    g = extra * block_tokens / prefill_per_us - move
    if g > 0:
        return pick, size, g, best
    return -1, 0, 0.0, best


@nb.njit(cache=True)
def pull_kernel(hits: np.ndarray, inst: np.ndarray, skip: np.ndarray, position: np.ndarray, block_tokens: int,
                kv_bytes_per_token: int, intra_gbs: float, inter_gbs: float, intra_latency_us: float,
                inter_latency_us: float, prefill_per_us: float):
    """`pull_one` per routed request (row i of `hits`, routed to column `inst[i]`, `skip[i]` for
    one that moves its KV anyway). Returns (requests kept, source column, bytes, gain µs), in
    request order; the same arithmetic, in the same order, as the numpy formulas it replaces."""
    k = hits.shape[0]
    want = np.empty(k, dtype=np.int64)
    src = np.empty(k, dtype=np.int64)
    nbytes = np.empty(k, dtype=np.int64)
    gain = np.empty(k, dtype=np.float64)
    n = 0
    for i in range(k):
        if skip[i]:
            continue
        pick, size, g, _ = pull_one(hits, i, inst[i], position, block_tokens, kv_bytes_per_token, intra_gbs,
                                    inter_gbs, intra_latency_us, inter_latency_us, prefill_per_us)
        if pick >= 0:
            want[n] = i
            src[n] = pick
            nbytes[n] = size
            gain[n] = g
            n += 1
    return want[:n], src[:n], nbytes[:n], gain[:n]


@dataclass(frozen=True)
class CostOptions(RoutePass):
    """Options of the passes that estimate engine time: the model and GPU of the cost model."""

    model: str = "llama-3-8b"
    gpu: str = "h100"
    tp: int = 1

    def rates(self) -> tuple[float, float, float]:
        try:
            return engine_rates(self.model, self.gpu, self.tp)
        except (KeyError, ValueError) as e:
            raise ValueError(f"pass '{self.name}': {e}") from None

    def run(self, route: RouteView) -> None:  # pragma: no cover - abstract helper base
        raise NotImplementedError


@dataclass(frozen=True)
class LinkOptions(CostOptions):
    """Options of the passes that move KV between instances: the link model.

    Instances at one topology `position` share a fast link (NVLink / one node); others
    go over the network, `inter-latency-us` per position apart."""

    intra_gbs: float = 100.0  # GB/s between instances at one position
    inter_gbs: float = 25.0  # GB/s across positions (200 Gb/s RDMA)
    intra_latency_us: float = 10.0
    inter_latency_us: float = 50.0
    kv_bytes_per_token: int = LLAMA3_8B_KV_BYTES_PER_TOKEN
    block_tokens: int = 512  # tokens per prefix hash of `cluster.prefix` / `cluster.digest`

    def link_options(self) -> tuple[float, ...]:
        """The link model and the prefill rate as a lowered pass reads them (`o[0:7]`): block tokens,
        KV bytes per token, intra / inter GB/s, intra / inter latency µs, prefill tokens per µs."""
        return (self.block_tokens, self.kv_bytes_per_token, self.intra_gbs, self.inter_gbs, self.intra_latency_us,
                self.inter_latency_us, self.rates()[0])

    def move_us(self, src_pos: np.ndarray, dst_pos: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Microseconds to move `nbytes` of KV between instances at these positions."""
        return link_us(src_pos, dst_pos, nbytes, self.intra_gbs, self.inter_gbs, self.intra_latency_us,
                       self.inter_latency_us)


def link_us(src_pos: np.ndarray, dst_pos: np.ndarray, nbytes: np.ndarray, intra_gbs: float, inter_gbs: float,
            intra_latency_us: float, inter_latency_us: float) -> np.ndarray:
    """`one_move_us` for each move."""
    return _moves_us(np.asarray(src_pos, np.int64), np.asarray(dst_pos, np.int64), np.asarray(nbytes, np.int64),
                     float(intra_gbs), float(inter_gbs), float(intra_latency_us), float(inter_latency_us))


@functools.lru_cache(maxsize=16)
def engine_rates(model: str, gpu: str, tp: int) -> tuple[float, float, float]:
    """(prefill tokens per µs, decode step µs at batch 1, extra decode µs per running request),
    from the simulator's cost model: what an early-reject or a cost/benefit test needs."""
    from schedir.sim.cost_model import CostModel

    cost = CostModel.create(model, gpu, tp)
    chunk = 8192
    prefill_s = cost.step_time(np.array([chunk], np.int64), np.array([0], np.int64))
    one = cost.step_time(np.ones(1, np.int64), np.full(1, 2048, np.int64))
    many = cost.step_time(np.ones(128, np.int64), np.full(128, 2048, np.int64))
    return chunk / (prefill_s * 1e6), one * 1e6, (many - one) * 1e6 / 127
