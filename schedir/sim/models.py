"""Model shapes and GPU constants the cost model is built from.

`ModelSpec` holds the architecture (what a Hugging Face config says); `GpuSpec`
holds the datasheet figures plus the handful of constants fitted by
`benchmarks/calibrate_cost_model.py` on the measured tables in
../shared/data/profiles (Vidur's per-operator times, aiconfigurator's H100
tables). No measured row lives here, only the fitted parameters.
"""

from __future__ import annotations

import difflib

import attrs


@attrs.frozen
class ModelSpec:
    """A dense decoder-only transformer (Llama family: gated SiLU MLP, RMSNorm, RoPE, GQA)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_model_len: int
    dtype_bytes: int = 2

    @property
    def params_per_layer(self) -> int:
        """Weights of one decoder layer: q, k, v, o projections, gate/up/down, two norms."""
        h, hd = self.hidden_size, self.head_dim
        attn = h * hd * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * h * self.intermediate_size
        return attn + mlp + 2 * h

    @property
    def num_params(self) -> int:
        """All weights: layers, input embedding, untied LM head, final norm."""
        return self.num_layers * self.params_per_layer + 2 * self.vocab_size * self.hidden_size + self.hidden_size


@attrs.frozen
class GpuSpec:
    """One GPU: datasheet figures and the cost model's fitted constants.

    Every `*_s` is seconds, `*_eff` a fraction of the datasheet peak. The
    fitted values come from `benchmarks/calibrate_cost_model.py`; the table
    each was fitted on is named beside it in `GPUS`.
    """

    name: str
    memory_gib: float
    peak_tflops: float  # dense bf16 tensor-core datasheet peak
    mem_bw_tbs: float  # HBM datasheet bandwidth
    # GEMM: t = overhead + max(flops / (peak * eff(m)), bytes / (bw * gemm_bw_eff)),
    # eff(m) = gemm_eff_max * m / (m + gemm_m_half)
    gemm_overhead_s: float
    gemm_eff_max: float
    gemm_m_half: float
    gemm_bw_eff: float
    # prefill attention: t = overhead + work / (peak * eff(q)), eff(q) = eff_max * q / (q + q_half),
    # work = 4 hd (q_heads + kv_weight * kv_heads) q (context + causal * (q + 1)): K/V tile loads cost
    # like `kv_weight` extra heads (MHA runs slower per FLOP than GQA), and the kernel pays `causal`
    # (0.5 ideal) of the q x q square
    attn_prefill_overhead_s: float
    attn_prefill_eff_max: float
    attn_prefill_q_half: float
    attn_prefill_kv_weight: float
    attn_prefill_causal: float
    # decode attention: t = overhead + per_request * n + kv_bytes / (bw * eff)
    attn_decode_overhead_s: float
    attn_decode_per_request_s: float
    attn_decode_bw_eff: float
    # all-reduce, as NCCL picks the faster of two protocols (low-latency and bulk):
    # t = min(latency + bus_bytes / bus_bw, bulk_latency + bus_bytes / bulk_bus_bw),
    # bus_bytes = 2 (tp-1)/tp * bytes; one value per TP degree 2, 4, 8
    all_reduce_latency_s: tuple[float, float, float]
    all_reduce_bus_gbs: tuple[float, float, float]
    all_reduce_bulk_latency_s: tuple[float, float, float]
    all_reduce_bulk_bus_gbs: tuple[float, float, float]
    # memory-bound elementwise kernels: t = overhead + bytes / (bw * eff[kind])
    elementwise_overhead_s: float
    elementwise_bw_eff: tuple[tuple[str, float], ...]

    @property
    def peak_flops(self) -> float:
        return self.peak_tflops * 1e12

    @property
    def mem_bw(self) -> float:
        return self.mem_bw_tbs * 1e12


MODELS: dict[str, ModelSpec] = {
    # Llama-3.1-8B's 128k context with the Llama-3-8B shapes (identical but for RoPE scaling),
    # so long traces such as the Mooncake replay fit.
    "llama-3-8b": ModelSpec("llama-3-8b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
                            head_dim=128, intermediate_size=14336, vocab_size=128256, max_model_len=131072),
    "llama-2-7b": ModelSpec("llama-2-7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32,
                            head_dim=128, intermediate_size=11008, vocab_size=32000, max_model_len=4096),
    "llama-2-70b": ModelSpec("llama-2-70b", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
                             head_dim=128, intermediate_size=28672, vocab_size=32000, max_model_len=4096),
}

# FITTED_GPUS_BEGIN (pasted from `python benchmarks/calibrate_cost_model.py`)
GPUS: dict[str, GpuSpec] = {
    # fitted by benchmarks/calibrate_cost_model.py on:
    #   gemm: vidur h100 Llama-2-7b-hf (4176 rows); vidur h100 Llama-2-70b-hf (4176 rows); aiconfigurator h100 bf16 (35742 rows)
    #   elementwise: vidur h100 Llama-2-7b-hf (6264 rows); vidur h100 Llama-2-70b-hf (6264 rows)
    #   attention_prefill: aiconfigurator h100 fa3 (5763 rows) (held: attn_prefill_causal=0.5)
    #   attention_decode: aiconfigurator h100 fa3 (6770 rows)
    #   all_reduce: vidur h100_dgx (2982 rows); aiconfigurator nccl 2.27.3 (126 rows); aiconfigurator nccl 2.29.2 (63 rows)
    "h100": GpuSpec(name='h100', memory_gib=79.2, peak_tflops=989, mem_bw_tbs=3.35, gemm_overhead_s=3.593e-06, gemm_eff_max=0.758, gemm_m_half=198.8, gemm_bw_eff=0.8523, attn_prefill_overhead_s=1.328e-05, attn_prefill_eff_max=0.8136, attn_prefill_q_half=1312, attn_prefill_kv_weight=0.7123, attn_prefill_causal=0.5, attn_decode_overhead_s=1.168e-05, attn_decode_per_request_s=5.895e-08, attn_decode_bw_eff=0.9053, all_reduce_latency_s=(6.57e-06, 1.01e-05, 1.698e-05), all_reduce_bus_gbs=(66.28, 70.21, 163.9), all_reduce_bulk_latency_s=(2.23e-05, 2.192e-05, 3.938e-05), all_reduce_bulk_bus_gbs=(306.2, 337.8, 400.2), elementwise_overhead_s=2.116e-06, elementwise_bw_eff=(('norm', 0.3979), ('rope', 0.5394), ('act', 0.5817), ('add', 1.267), ('emb', 0.1838))),
    # fitted by benchmarks/calibrate_cost_model.py on:
    #   gemm: vidur a100 Llama-2-7b-hf (4176 rows); vidur a100 Llama-2-70b-hf (4176 rows); vidur a100 Meta-Llama-3-8B (7296 rows)
    #   elementwise: vidur a100 Llama-2-7b-hf (6264 rows); vidur a100 Llama-2-70b-hf (6264 rows); vidur a100 Meta-Llama-3-8B (10944 rows)
    #   attention_prefill: vidur legacy a100 70B/TP2 (4418 rows) (held: attn_prefill_kv_weight=0.7123)
    #   attention_decode: vidur legacy a100 70B/TP2 (10240 rows)
    #   all_reduce: vidur a100_dgx (2982 rows)
    "a100": GpuSpec(name='a100', memory_gib=79.2, peak_tflops=312, mem_bw_tbs=2.039, gemm_overhead_s=6.205e-06, gemm_eff_max=0.7404, gemm_m_half=86.92, gemm_bw_eff=0.8134, attn_prefill_overhead_s=2.5e-05, attn_prefill_eff_max=0.395, attn_prefill_q_half=1.125e-09, attn_prefill_kv_weight=0.7123, attn_prefill_causal=1, attn_decode_overhead_s=1.701e-05, attn_decode_per_request_s=2.455e-09, attn_decode_bw_eff=0.7618, all_reduce_latency_s=(6.023e-05, 3.249e-05, 3.89e-05), all_reduce_bus_gbs=(180.3, 119.7, 129.1), all_reduce_bulk_latency_s=(4.424e-05, 6.824e-05, 0.0001545), all_reduce_bulk_bus_gbs=(169.8, 190.5, 225.2), elementwise_overhead_s=2.424e-06, elementwise_bw_eff=(('norm', 0.379), ('rope', 0.4564), ('act', 0.4926), ('add', 1.053), ('emb', 0.1529))),
}
# FITTED_GPUS_END


# The host link a swap copies KV over (vLLM v0's swap_in / swap_out): PCIe x16 per direction, from the
# datasheets (H100 SXM: PCIe Gen5, 64 GB/s; A100: PCIe Gen4, 32 GB/s). Not measured here: a simulated
# swap costs its bytes at this peak, so swapping is, if anything, made to look cheap.
HOST_LINK_GBS: dict[str, float] = {"h100": 64.0, "a100": 32.0}


def _lookup(kind: str, name: str, registry: dict) -> object:
    key = name.lower()
    if key in registry:
        return registry[key]
    known = ", ".join(sorted(registry))
    close = difflib.get_close_matches(key, list(registry), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown {kind} {name!r}: known {kind}s are {known}{hint}")


def get_model(name: str) -> ModelSpec:
    """The built-in model called `name` (case-insensitive); ValueError names the known ones."""
    return _lookup("model", name, MODELS)  # type: ignore[return-value]


def get_gpu(name: str) -> GpuSpec:
    """The built-in GPU called `name` (case-insensitive); ValueError names the known ones."""
    return _lookup("gpu", name, GPUS)  # type: ignore[return-value]
