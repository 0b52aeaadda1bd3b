"""GPU time of one engine step, from the batch plan, as a roofline over the model's operators.

A step runs every layer once over all the step's tokens: four GEMMs (qkv, o,
gate/up, down), prefill attention over the requests computing more than one
token, decode attention over those computing one, two all-reduces with tensor
parallelism, and memory-bound elementwise kernels (two RMSNorms, RoPE,
SiLU-and-mul, two residual adds). Once per step come the embedding, the final
norm, the LM head on one row per request, the logits gather, sampling and a
fixed host-side cost. Each operator is a public function of a `GpuSpec`, so
`benchmarks/cost_model_error.py` can check it alone against the measured tables.

The operator functions take numpy arrays (one entry per measured row) or plain
numbers; `CostModel.step_time` is called once per simulated step and sticks to
a few numpy reductions plus scalar arithmetic (~10-20 µs, see benchmarks/README.md).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from schedir.sim.models import HOST_LINK_GBS, GpuSpec, ModelSpec, get_gpu, get_model

ArrayLike = np.ndarray | float | int

# Assumed, not fitted (no table measures them): the host-side cost of one vLLM step that
# the GPU kernels do not hide (input prep, sampler launch, output processing), and the
# memory the engine keeps besides weights and KV cache (activation peak of the profiling
# run at 8192 batched tokens, CUDA graphs, NCCL and allocator slack), in vLLM's accounting.
STEP_OVERHEAD_S = 200e-6
ACTIVATION_RESERVE_GIB = 2.0
SAMPLER_PASSES = 3  # softmax / top-p / argmax each read the fp32 logits once

TP_DEGREES = (1, 2, 4, 8)
BREAKDOWN_KEYS = ("gemm", "attention_prefill", "attention_decode", "all_reduce", "elementwise", "other")


# ---- operators -------------------------------------------------------------------------------


def gemm_time(gpu: GpuSpec, m: ArrayLike, n: ArrayLike, k: ArrayLike, dtype_bytes: int = 2) -> ArrayLike:
    """Seconds of one (m x k) @ (k x n) GEMM: compute-bound with an efficiency that grows with m, else memory-bound."""
    m = np.asarray(m, dtype=np.float64)
    flops = 2.0 * m * n * k
    nbytes = dtype_bytes * (m * k + k * n + m * n)
    eff = gpu.gemm_eff_max * m / (m + gpu.gemm_m_half)
    return gpu.gemm_overhead_s + np.maximum(flops / (gpu.peak_flops * eff), nbytes / (gpu.mem_bw * gpu.gemm_bw_eff))


def prefill_attention_flops(q_tokens: ArrayLike, context: ArrayLike, num_heads: int, head_dim: int) -> ArrayLike:
    """QK^T and PV FLOPs of causal attention for q new tokens after `context` cached ones."""
    q = np.asarray(q_tokens, dtype=np.float64)
    return 4.0 * num_heads * head_dim * q * (context + (q + 1.0) / 2.0)


def _prefill_work(gpu: GpuSpec, q: ArrayLike, context: ArrayLike, num_heads: ArrayLike, num_kv_heads: ArrayLike,
                  head_dim: ArrayLike) -> ArrayLike:
    """Seconds of kernel work of one prefill request (see `GpuSpec`), at an efficiency that grows with its chunk."""
    q = np.asarray(q, dtype=np.float64)
    heads = num_heads + gpu.attn_prefill_kv_weight * np.asarray(num_kv_heads, dtype=np.float64)
    # flops / (peak * eff) with eff = eff_max * q / (q + q_half): the q cancels
    work = 4.0 * heads * head_dim * (q + gpu.attn_prefill_q_half) * (context + gpu.attn_prefill_causal * (q + 1.0))
    return work / (gpu.peak_flops * gpu.attn_prefill_eff_max)


def attention_prefill_time(gpu: GpuSpec, q_tokens: ArrayLike, context: ArrayLike, num_heads: int,
                           num_kv_heads: int, head_dim: int, batch: ArrayLike = 1) -> ArrayLike:
    """Seconds of one prefill attention kernel over `batch` requests of `q_tokens` new tokens after `context`.

    Heads are per GPU. Compute-bound: FlashAttention's prefill reads each KV tile once per
    query tile, far below the tensor-core time at the chunk sizes schedulers use.
    """
    return gpu.attn_prefill_overhead_s + np.asarray(batch) * _prefill_work(gpu, q_tokens, context, num_heads,
                                                                         num_kv_heads, head_dim)


def kv_read_bytes(kv_len: ArrayLike, num_kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> ArrayLike:
    """Bytes of K and V one layer reads for `kv_len` cached tokens."""
    return 2.0 * dtype_bytes * num_kv_heads * head_dim * np.asarray(kv_len, dtype=np.float64)


def attention_decode_time(gpu: GpuSpec, kv_len: ArrayLike, num_kv_heads: int, head_dim: int,
                          batch: ArrayLike = 1, dtype_bytes: int = 2) -> ArrayLike:
    """Seconds of one decode attention kernel over `batch` requests each reading `kv_len` cached tokens.

    Memory-bound over the KV bytes read, plus a per-request cost (block-table walk, split-KV reduction).
    """
    batch = np.asarray(batch, dtype=np.float64)
    kv = batch * kv_read_bytes(kv_len, num_kv_heads, head_dim, dtype_bytes)
    return (gpu.attn_decode_overhead_s + batch * gpu.attn_decode_per_request_s
            + kv / (gpu.mem_bw * gpu.attn_decode_bw_eff))


def _tp_index(tp: int) -> int:
    return {2: 0, 4: 1, 8: 2}[tp]


def _collective_time(gpu: GpuSpec, bus_bytes: ArrayLike, tp: int) -> ArrayLike:
    """The faster of the low-latency and the bulk protocol for `bus_bytes` per GPU over `tp` GPUs."""
    i = _tp_index(tp)
    low = gpu.all_reduce_latency_s[i] + bus_bytes / (gpu.all_reduce_bus_gbs[i] * 1e9)
    bulk = gpu.all_reduce_bulk_latency_s[i] + bus_bytes / (gpu.all_reduce_bulk_bus_gbs[i] * 1e9)
    return np.minimum(low, bulk)


def all_reduce_time(gpu: GpuSpec, nbytes: ArrayLike, tp: int) -> ArrayLike:
    """Seconds of one ring all-reduce of `nbytes` over `tp` GPUs (0 at tp 1)."""
    if tp == 1:
        return np.zeros_like(np.asarray(nbytes, dtype=np.float64))
    return _collective_time(gpu, 2.0 * (tp - 1) / tp * np.asarray(nbytes, dtype=np.float64), tp)


def all_gather_time(gpu: GpuSpec, nbytes: ArrayLike, tp: int) -> ArrayLike:
    """Seconds to gather `nbytes` in all over `tp` GPUs: a ring all-gather moves half an all-reduce's bytes."""
    if tp == 1:
        return np.zeros_like(np.asarray(nbytes, dtype=np.float64))
    return _collective_time(gpu, (tp - 1) / tp * np.asarray(nbytes, dtype=np.float64), tp)


ELEMENTWISE_KINDS = ("norm", "rope", "act", "add", "emb")


def elementwise_time(gpu: GpuSpec, nbytes: ArrayLike, kind: str = "add") -> ArrayLike:
    """Seconds of one memory-bound kernel moving `nbytes`; `kind` picks its fitted bandwidth efficiency."""
    eff = dict(gpu.elementwise_bw_eff)[kind]
    return gpu.elementwise_overhead_s + np.asarray(nbytes, dtype=np.float64) / (gpu.mem_bw * eff)


def elementwise_bytes(kind: str, tokens: ArrayLike, hidden: int, q_heads: int = 0, kv_heads: int = 0,
                      head_dim: int = 0, intermediate: int = 0, dtype_bytes: int = 2) -> ArrayLike:
    """Bytes read and written by one elementwise kernel over `tokens` rows (per-GPU sizes)."""
    m = np.asarray(tokens, dtype=np.float64)
    if kind == "norm":  # read x, write y (the weight is negligible)
        return 2.0 * dtype_bytes * m * hidden
    if kind == "rope":  # q and k rotated in place
        return 2.0 * dtype_bytes * m * (q_heads + kv_heads) * head_dim
    if kind == "act":  # SiLU(gate) * up: read 2I, write I
        return 3.0 * dtype_bytes * m * intermediate
    if kind == "add":  # residual add: read two, write one
        return 3.0 * dtype_bytes * m * hidden
    if kind == "emb":  # gather rows of the table, write them
        return 2.0 * dtype_bytes * m * hidden
    raise ValueError(f"unknown elementwise kind {kind!r}: known are {', '.join(ELEMENTWISE_KINDS)}")


# ---- the step --------------------------------------------------------------------------------


@nb.njit(cache=True)
def _batch_sums(num_tokens: np.ndarray, context: np.ndarray, q_half: float,
                causal: float) -> tuple[float, int, float, float, float]:
    """One pass over a batch: total tokens, decode count, decode KV tokens, prefill work, causal q*kv sum."""
    total = 0.0
    n_dec = 0
    dec_kv = 0.0
    work = 0.0
    qc = 0.0
    for i in range(num_tokens.size):
        q = float(num_tokens[i])
        c = float(context[i])
        total += q
        qc += q * (c + (q + 1.0) / 2.0)
        if num_tokens[i] == 1:
            n_dec += 1
            dec_kv += c + 1.0
        else:
            work += (q + q_half) * (c + causal * (q + 1.0))
    return total, n_dec, dec_kv, work, qc


class CostModel:
    """Step time, FLOPs and KV capacity of `model` on `tp` GPUs of kind `gpu`.

    `step_time(num_tokens, context)`: request i computes num_tokens[i] new tokens at
    positions [context[i], context[i] + num_tokens[i]). Requests with one new token
    go to the decode attention kernel, the others to the prefill one.
    """

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int = 1) -> None:
        if tp not in TP_DEGREES:
            raise ValueError(f"tp must be one of {', '.join(map(str, TP_DEGREES))}, got {tp}")
        if model.num_heads % tp or model.num_kv_heads % tp:
            raise ValueError(f"{model.name}: {model.num_heads} q heads and {model.num_kv_heads} kv heads "
                             f"must both divide by tp {tp}")
        self.model, self.gpu, self.tp = model, gpu, tp
        h, hd = model.hidden_size, model.head_dim
        self._q_heads = model.num_heads // tp
        self._kv_heads = model.num_kv_heads // tp
        self._inter = model.intermediate_size // tp
        # per-layer GEMMs (n, k) per GPU: qkv, o, gate+up, down
        self._gemm_n = np.array([(self._q_heads + 2 * self._kv_heads) * hd, h, 2 * self._inter, h], np.float64)
        self._gemm_k = np.array([h, self._q_heads * hd, h, self._inter], np.float64)
        # elementwise bytes per token per layer, divided by each kind's efficiency: 2 norms, rope, act, 2 adds
        eff = dict(gpu.elementwise_bw_eff)
        per_tok = {kind: float(elementwise_bytes(kind, 1, h, self._q_heads, self._kv_heads, hd, self._inter,
                                                 model.dtype_bytes)) for kind in ELEMENTWISE_KINDS}
        self._ew_s_per_token = (2 * per_tok["norm"] / eff["norm"] + per_tok["rope"] / eff["rope"]
                                + per_tok["act"] / eff["act"] + 2 * per_tok["add"] / eff["add"]) / gpu.mem_bw
        self._ew_fixed_s = 6 * gpu.elementwise_overhead_s
        self._emb_s_per_token = (per_tok["emb"] / eff["emb"] + per_tok["norm"] / eff["norm"]) / gpu.mem_bw
        self._kv_bytes_per_token_layer = float(kv_read_bytes(1, self._kv_heads, hd, model.dtype_bytes))
        heads = self._q_heads + gpu.attn_prefill_kv_weight * self._kv_heads
        self._prefill_scale = 4.0 * heads * hd / (gpu.peak_flops * gpu.attn_prefill_eff_max)
        self._act_bytes_per_token = model.dtype_bytes * h
        self._by_total: dict[float, tuple[float, float]] = {}
        self._by_req: dict[int, tuple[float, float]] = {}

    def host_blocks(self, swap_space_gib: float, block_size: int) -> int:
        """KV blocks of `block_size` tokens that `swap_space_gib` of host memory holds per GPU (vLLM
        v0's `--swap-space`, 4 GiB by default, sizes its CPU block pool this way)."""
        if swap_space_gib < 0:
            raise ValueError(f"swap_space_gib must be >= 0, got {swap_space_gib}")
        per_block = block_size * self._kv_bytes_per_token_layer * self.model.num_layers
        return int(swap_space_gib * (1 << 30) // per_block)

    def swap_time(self, blocks: int, block_size: int) -> float:
        """Seconds to copy `blocks` KV blocks (every layer, this GPU's heads) between GPU and host
        memory over PCIe at its datasheet peak (`HOST_LINK_GBS`): a step that swaps (vLLM v0's
        `blocks_to_swap_in` / `blocks_to_swap_out`) waits for its copies."""
        if blocks <= 0:
            return 0.0
        link = HOST_LINK_GBS.get(self.gpu.name)
        if link is None:
            raise ValueError(f"no host-link bandwidth for GPU {self.gpu.name!r}: swapping cannot be timed "
                             f"(known: {', '.join(sorted(HOST_LINK_GBS))})")
        nbytes = blocks * block_size * self._kv_bytes_per_token_layer * self.model.num_layers
        return nbytes / (link * 1e9)

    @classmethod
    def create(cls, model_name: str, gpu_name: str, tp: int = 1) -> CostModel:
        """The cost model of a built-in model on a built-in GPU."""
        return cls(get_model(model_name), get_gpu(gpu_name), tp)

    # -- per-layer pieces, each in seconds for the whole step --

    def _terms(self, num_tokens: np.ndarray, context: np.ndarray) -> tuple[float, float, float, float, float, float]:
        gpu, model, L = self.gpu, self.model, self.model.num_layers
        n_req = len(num_tokens)
        q = num_tokens.astype(np.float64)
        total = float(q.sum())
        decode = num_tokens == 1
        n_dec = int(np.count_nonzero(decode))

        gemm = L * float(np.sum(gemm_time(gpu, total, self._gemm_n, self._gemm_k, model.dtype_bytes)))

        prefill = 0.0
        if n_dec < n_req:
            qp = q[~decode]
            cp = context[~decode]
            # `_prefill_work` summed over requests, its per-step factor in `_prefill_scale`
            work = (qp + gpu.attn_prefill_q_half) * (cp + gpu.attn_prefill_causal * (qp + 1.0))
            prefill = L * (gpu.attn_prefill_overhead_s + float(work.sum()) * self._prefill_scale)
        dec = 0.0
        if n_dec:
            kv_tokens = float(context[decode].sum()) + n_dec
            dec = L * (gpu.attn_decode_overhead_s + n_dec * gpu.attn_decode_per_request_s
                       + kv_tokens * self._kv_bytes_per_token_layer / (gpu.mem_bw * gpu.attn_decode_bw_eff))

        ar = 0.0
        if self.tp > 1:
            ar = 2 * L * float(all_reduce_time(gpu, total * self._act_bytes_per_token, self.tp))

        ew = L * (self._ew_fixed_s + total * self._ew_s_per_token)

        lm_head = float(gemm_time(gpu, n_req, model.vocab_size // self.tp, model.hidden_size, model.dtype_bytes))
        logits_bytes = 4.0 * n_req * model.vocab_size  # fp32 logits of the sampled rows
        other = (STEP_OVERHEAD_S + lm_head + 2 * gpu.elementwise_overhead_s + total * self._emb_s_per_token
                 + float(all_gather_time(gpu, logits_bytes, self.tp))
                 + SAMPLER_PASSES * float(elementwise_time(gpu, logits_bytes, "add")))
        return gemm, prefill, dec, ar, ew, other

    def step_cost(self, num_tokens: np.ndarray, context: np.ndarray) -> tuple[float, float]:
        """`(step_time, flops)` in one pass: the simulator's per-step call (a few µs).

        The same formulas as `_terms` and `flops`: the per-request sums come from one
        Numba loop, and the parts that depend only on the batch's token count or
        request count (GEMMs, elementwise, all-reduce, LM head, sampler) are memoised.
        """
        n_req = len(num_tokens)
        if n_req == 0:
            return 0.0, 0.0
        self._check(num_tokens, context)
        gpu, model, L = self.gpu, self.model, self.model.num_layers
        total, n_dec, dec_kv, work, qc = _batch_sums(num_tokens, context, gpu.attn_prefill_q_half,
                                                     gpu.attn_prefill_causal)
        by_total, by_req = self._memo_terms(total, n_req)
        seconds = by_total[0] + by_req[0]
        if n_dec < n_req:
            seconds += L * (gpu.attn_prefill_overhead_s + work * self._prefill_scale)
        if n_dec:
            seconds += L * (gpu.attn_decode_overhead_s + n_dec * gpu.attn_decode_per_request_s
                            + dec_kv * self._kv_bytes_per_token_layer / (gpu.mem_bw * gpu.attn_decode_bw_eff))
        flops = by_total[1] + by_req[1] + L * 4.0 * model.num_heads * model.head_dim * qc
        return seconds, flops

    def decode_terms(self, n: int) -> tuple:
        """`step_cost`'s constants for a batch of `n` decodes, for a kernel that computes the
        same step time and FLOPs (`schedir.sim.decode_run`): (q_half, causal, token-count
        seconds, FLOPs, request-count seconds, FLOPs, layers, decode attention overhead, per
        request, KV bytes per token and layer, memory bandwidth, its efficiency, heads, head dim)."""
        gpu, model = self.gpu, self.model
        by_total, by_req = self._memo_terms(float(n), n)
        return (float(gpu.attn_prefill_q_half), float(gpu.attn_prefill_causal), float(by_total[0]),
                float(by_total[1]), float(by_req[0]), float(by_req[1]), int(model.num_layers),
                float(gpu.attn_decode_overhead_s), float(gpu.attn_decode_per_request_s),
                float(self._kv_bytes_per_token_layer), float(gpu.mem_bw), float(gpu.attn_decode_bw_eff),
                int(model.num_heads), int(model.head_dim))

    def _memo_terms(self, total: float, n_req: int) -> tuple[tuple[float, float], tuple[float, float]]:
        """(seconds, FLOPs) of the terms set by the step's token count and by its request count, memoised."""
        by_total = self._by_total.get(total)
        if by_total is None:
            by_total = self._by_total[total] = self._total_terms(total)
        by_req = self._by_req.get(n_req)
        if by_req is None:
            by_req = self._by_req[n_req] = self._request_terms(n_req)
        return by_total, by_req

    def _total_terms(self, total: float) -> tuple[float, float]:
        """Seconds and FLOPs that depend only on the step's token count."""
        gpu, model, L = self.gpu, self.model, self.model.num_layers
        seconds = L * float(np.sum(gemm_time(gpu, total, self._gemm_n, self._gemm_k, model.dtype_bytes)))
        if self.tp > 1:
            seconds += 2 * L * float(all_reduce_time(gpu, total * self._act_bytes_per_token, self.tp))
        seconds += L * (self._ew_fixed_s + total * self._ew_s_per_token) + total * self._emb_s_per_token
        return seconds, 2.0 * L * model.params_per_layer * total

    def _request_terms(self, n_req: int) -> tuple[float, float]:
        """Seconds and FLOPs that depend only on how many requests sample (LM head, sampler, overhead)."""
        gpu, model = self.gpu, self.model
        lm_head = float(gemm_time(gpu, n_req, model.vocab_size // self.tp, model.hidden_size, model.dtype_bytes))
        logits_bytes = 4.0 * n_req * model.vocab_size
        seconds = (STEP_OVERHEAD_S + lm_head + 2 * gpu.elementwise_overhead_s
                   + float(all_gather_time(gpu, logits_bytes, self.tp))
                   + SAMPLER_PASSES * float(elementwise_time(gpu, logits_bytes, "add")))
        return seconds, 2.0 * n_req * model.vocab_size * model.hidden_size

    @staticmethod
    def _check(num_tokens: np.ndarray, context: np.ndarray) -> None:
        if len(num_tokens) != len(context):
            raise ValueError(f"num_tokens has {len(num_tokens)} entries, context {len(context)}")

    def step_time(self, num_tokens: np.ndarray, context: np.ndarray) -> float:
        """Seconds of one engine step (all TP GPUs in lockstep); 0.0 for an empty batch."""
        if len(num_tokens) == 0:
            return 0.0
        self._check(num_tokens, context)
        return math.fsum(self._terms(num_tokens, context))

    def breakdown(self, num_tokens: np.ndarray, context: np.ndarray) -> dict[str, float]:
        """The step time split per operator family (keys `BREAKDOWN_KEYS`); sums to `step_time`."""
        if len(num_tokens) == 0:
            return dict.fromkeys(BREAKDOWN_KEYS, 0.0)
        self._check(num_tokens, context)
        return dict(zip(BREAKDOWN_KEYS, self._terms(num_tokens, context)))

    def flops(self, num_tokens: np.ndarray, context: np.ndarray) -> float:
        """Model FLOPs of the step: 2 x layer weights per token, causal attention, the LM head rows."""
        if len(num_tokens) == 0:
            return 0.0
        model = self.model
        total = float(np.sum(num_tokens))
        dense = 2.0 * model.num_layers * model.params_per_layer * total
        attn = model.num_layers * float(np.sum(prefill_attention_flops(num_tokens, context, model.num_heads,
                                                                        model.head_dim)))
        lm_head = 2.0 * len(num_tokens) * model.vocab_size * model.hidden_size
        return dense + attn + lm_head

    @property
    def peak_flops(self) -> float:
        """Datasheet dense FLOP/s of the whole TP group (multiply by a step's seconds for its peak FLOPs)."""
        return self.tp * self.gpu.peak_flops

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token takes over all layers and the whole TP group."""
        m = self.model
        return 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes

    @property
    def weight_bytes_per_gpu(self) -> float:
        """Weights one GPU holds: everything sharded by tp (norms are replicated, a rounding error)."""
        return self.model.num_params * self.model.dtype_bytes / self.tp

    def kv_cache_blocks(self, block_size: int, gpu_memory_utilization: float = 0.9) -> int:
        """KV blocks of `block_size` tokens one TP group holds, in vLLM's accounting.

        Per GPU: memory x utilization - its weight shard - `ACTIVATION_RESERVE_GIB`, divided by
        the per-GPU bytes of one block (each GPU keeps its own kv heads of every block).
        """
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must lie in (0, 1], got {gpu_memory_utilization}")
        gib = 1 << 30
        free = self.gpu.memory_gib * gib * gpu_memory_utilization - self.weight_bytes_per_gpu \
            - ACTIVATION_RESERVE_GIB * gib
        block_bytes = block_size * self.kv_bytes_per_token / self.tp
        return max(0, int(free // block_bytes))
