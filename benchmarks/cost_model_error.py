"""How far the cost model's operators are from the measured tables in ../shared/data/profiles.

    python benchmarks/cost_model_error.py [--profiles DIR] [--sample N]

For every measured row that maps onto one of the model's operators it predicts the
time with the operator functions of `schedir.sim.cost_model` and prints, per operator
family and source, the row count and the median and p90 relative error
|predicted - measured| / measured. Exits 0 always; prints whether each family meets
the issue's target (median <= 10%), or a skip line when the profiles are absent.

Domain (rows outside it are left out, and why):
- Vidur compute tables: the built-in models only (Llama-2-7B, Llama-2-70B, Llama-3-8B) on
  A100 and H100, every token count and TP degree profiled. Linear layers map to GEMMs;
  norms, RoPE, SiLU-and-mul, residual add and embedding to memory-bound kernels.
- aiconfigurator H100 GEMM: bf16 only (the models run in bf16; fp8 kernels are another model).
- aiconfigurator H100 attention: FlashAttention-3 (vLLM's H100 backend), bf16 KV cache, no
  sliding window, head_dim 128 (all built-in models); every batch, length and head count.
- all-reduce: Vidur's single-node DGX tables (NVSwitch, as in the SXM servers modelled),
  aiconfigurator's NCCL all_reduce in fp16; TP 2, 4, 8.
- Vidur legacy attention (A100, the 70B shape at TP 2: 32 q heads, 4 kv heads per GPU).
pandas and pyarrow are needed here only, never by schedir itself.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from schedir.sim import cost_model as cm
from schedir.sim.models import GpuSpec, get_gpu

DEFAULT_PROFILES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "profiles"
TARGET = 0.10
FAMILIES = ("gemm", "elementwise", "attention_prefill", "attention_decode", "all_reduce")

# Vidur compute tables of the built-in models, per GPU
VIDUR_MODELS = {
    "h100": ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-70b-hf"),
    "a100": ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-70b-hf", "meta-llama/Meta-Llama-3-8B"),
}
VIDUR_GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
VIDUR_ELEMENTWISE = {"input_layernorm": "norm", "post_attention_layernorm": "norm", "attn_rope": "rope",
                     "mlp_act": "act", "add": "add", "emb": "emb"}


@attrs.frozen
class Table:
    """Measured rows of one operator family from one source on one GPU: inputs and seconds."""

    family: str
    source: str
    gpu: str
    columns: dict[str, np.ndarray]
    measured_s: np.ndarray

    def __len__(self) -> int:
        return len(self.measured_s)

    def sample(self, n: int, seed: int = 0) -> Table:
        if len(self) <= n:
            return self
        idx = np.sort(np.random.default_rng(seed).choice(len(self), n, replace=False))
        return attrs.evolve(self, columns={k: v[idx] for k, v in self.columns.items()},
                            measured_s=self.measured_s[idx])


def _cols(df, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    return {n: df[n].to_numpy() for n in names}


def _vidur_compute(profiles: Path) -> list[Table]:
    import pandas as pd

    tables = []
    for gpu, models in VIDUR_MODELS.items():
        for model in models:
            path = profiles / "vidur" / "compute" / gpu / model / "mlp.csv"
            if not path.exists():
                continue
            df = pd.read_csv(path)
            tp = df.num_tensor_parallel_workers.to_numpy()
            m = df.num_tokens.to_numpy().astype(np.float64)
            h = df.n_embd.to_numpy()
            hd = h // df.n_head.to_numpy()
            qh, kvh = df.n_head.to_numpy() // tp, df.n_kv_head.to_numpy() // tp
            inter = df.n_expanded_embd.to_numpy() // tp
            gated = df.use_gated_mlp.to_numpy().astype(bool)
            shapes = {"attn_pre_proj": ((qh + 2 * kvh) * hd, h), "attn_post_proj": (h, qh * hd),
                      "mlp_up_proj": (np.where(gated, 2, 1) * inter, h), "mlp_down_proj": (h, inter)}
            name = model.split("/")[1]
            rows = {"m": [], "n": [], "k": [], "t": []}
            for op in VIDUR_GEMMS:
                n, k = shapes[op]
                rows["m"].append(m), rows["n"].append(n), rows["k"].append(k)
                rows["t"].append(df[f"time_stats.{op}.median"].to_numpy() * 1e-3)
            cat = {key: np.concatenate(v).astype(np.float64) for key, v in rows.items()}
            tables.append(Table("gemm", f"vidur {gpu} {name}", gpu, {k: cat[k] for k in "mnk"}, cat["t"]))
            kinds, nbytes, times = [], [], []
            for op, kind in VIDUR_ELEMENTWISE.items():
                col = f"time_stats.{op}.median"
                if col not in df:
                    continue
                nb = cm.elementwise_bytes(kind, m, h, qh, kvh, hd, inter)
                kinds.append(np.full(len(df), kind)), nbytes.append(nb), times.append(df[col].to_numpy() * 1e-3)
            tables.append(Table("elementwise", f"vidur {gpu} {name}", gpu,
                                {"kind": np.concatenate(kinds), "nbytes": np.concatenate(nbytes)},
                                np.concatenate(times)))
    return tables


def _vidur_all_reduce(profiles: Path) -> list[Table]:
    import pandas as pd

    tables = []
    for gpu in ("h100", "a100"):
        path = profiles / "vidur" / "network" / f"{gpu}_dgx" / "all_reduce.csv"
        if not path.exists():
            continue
        df = pd.read_csv(path)
        df = df[(df.num_workers == df.devices_per_node) & df.num_workers.isin([2, 4, 8])]
        # Vidur's `size` is bytes (fp16 tensors; its predictor divides by 2 x hidden for tokens)
        tables.append(Table("all_reduce", f"vidur {gpu}_dgx", gpu,
                            {"nbytes": df["size"].to_numpy().astype(np.float64),
                             "tp": df.num_workers.to_numpy()},
                            df["time_stats.all_reduce.median"].to_numpy() * 1e-3))
    return tables


def _vidur_legacy_attention(profiles: Path) -> list[Table]:
    import pandas as pd

    path = profiles / "vidur" / "legacy_a100" / "attention.csv"
    if not path.exists():
        return []
    df = pd.read_csv(path)
    tp = df.num_tensor_parallel_workers.to_numpy()
    hd = df.n_embd.to_numpy() // df.n_q_head.to_numpy()
    heads = {"q_heads": df.n_q_head.to_numpy() // tp, "kv_heads": df.n_kv_head.to_numpy() // tp, "head_dim": hd}
    pre = df.is_prefill.to_numpy().astype(bool)
    # reshapes around the kernel are part of the attention operator vLLM runs
    extra = (df["time_stats.attn_input_reshape.median"].fillna(0) + df["time_stats.attn_output_reshape.median"].fillna(0))
    prefill = Table("attention_prefill", "vidur legacy a100 70B/TP2", "a100",
                    {"batch": df.batch_size.to_numpy()[pre], "q": df.prefill_chunk_size.to_numpy()[pre],
                     "context": df.kv_cache_size.to_numpy()[pre], **{k: v[pre] for k, v in heads.items()}},
                    ((df["time_stats.attn_prefill.median"] + extra).to_numpy() * 1e-3)[pre])
    dec = ~pre
    decode = Table("attention_decode", "vidur legacy a100 70B/TP2", "a100",
                   {"batch": df.batch_size.to_numpy()[dec], "kv_len": df.kv_cache_size.to_numpy()[dec] + 1,
                    **{k: v[dec] for k, v in heads.items()}},
                   ((df["time_stats.attn_decode.median"] + extra).to_numpy() * 1e-3)[dec])
    return [prefill, decode]


def _aiconfigurator(profiles: Path) -> list[Table]:
    import pandas as pd

    root = profiles / "aiconfigurator_h100_sxm"
    tables = []
    gemm = root / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet"
    if gemm.exists():
        df = pd.read_parquet(gemm)
        df = df[df.gemm_dtype == "bfloat16"]
        tables.append(Table("gemm", "aiconfigurator h100 bf16", "h100",
                            {k: df[k].to_numpy().astype(np.float64) for k in "mnk"},
                            df.latency.to_numpy() * 1e-3))
    attn = root / "attention" / "vllm" / "0.24.0"
    for fname, family in (("context_attention_perf.parquet", "attention_prefill"),
                          ("generation_attention_perf.parquet", "attention_decode")):
        if not (attn / fname).exists():
            continue
        df = pd.read_parquet(attn / fname)
        df = df[(df.kernel_source == "vllm_flash_attn_fa3") & (df.kv_cache_dtype == "bfloat16")
                & (df.window_size == 0) & (df.head_dim == 128)]
        cols = {"batch": df.batch_size.to_numpy(), "q_heads": df.num_heads.to_numpy(),
                "kv_heads": df.num_key_value_heads.to_numpy(), "head_dim": df.head_dim.to_numpy()}
        if family == "attention_prefill":  # isl new tokens, nothing cached before
            cols |= {"q": df.isl.to_numpy(), "context": np.zeros(len(df), np.int64)}
        else:  # `step` cached tokens, one new: kv_len = step + 1
            cols |= {"kv_len": df.step.to_numpy() + 1}
        tables.append(Table(family, "aiconfigurator h100 fa3", "h100", cols, df.latency.to_numpy() * 1e-3))
    for nccl in sorted((root / "comm" / "nccl").glob("*/nccl_perf.parquet")):
        df = pd.read_parquet(nccl)
        df = df[(df.op_name == "all_reduce") & (df.nccl_dtype == "half")]
        if len(df) == 0:
            continue
        # message_size counts elements (nccl-tests bytes / 2 for half)
        tables.append(Table("all_reduce", f"aiconfigurator nccl {nccl.parent.name}", "h100",
                            {"nbytes": 2.0 * df.message_size.to_numpy(), "tp": df.num_gpus.to_numpy()},
                            df.latency.to_numpy() * 1e-3))
    return tables


def load_tables(profiles: Path) -> list[Table]:
    """Every in-domain measured table under `profiles` (see the module docstring)."""
    return (_vidur_compute(profiles) + _vidur_all_reduce(profiles) + _vidur_legacy_attention(profiles)
            + _aiconfigurator(profiles))


# ---- prediction ------------------------------------------------------------------------------


def _predict_gemm(gpu: GpuSpec, c: dict[str, np.ndarray]) -> np.ndarray:
    return cm.gemm_time(gpu, c["m"], c["n"], c["k"])


def _predict_elementwise(gpu: GpuSpec, c: dict[str, np.ndarray]) -> np.ndarray:
    out = np.empty(len(c["kind"]))
    for kind in np.unique(c["kind"]):
        sel = c["kind"] == kind
        out[sel] = cm.elementwise_time(gpu, c["nbytes"][sel], str(kind))
    return out


def _predict_prefill(gpu: GpuSpec, c: dict[str, np.ndarray]) -> np.ndarray:
    return cm.attention_prefill_time(gpu, c["q"], c["context"], c["q_heads"], c["kv_heads"], c["head_dim"],
                                     c["batch"])


def _predict_decode(gpu: GpuSpec, c: dict[str, np.ndarray]) -> np.ndarray:
    return cm.attention_decode_time(gpu, c["kv_len"], c["kv_heads"], c["head_dim"], c["batch"])


def _predict_all_reduce(gpu: GpuSpec, c: dict[str, np.ndarray]) -> np.ndarray:
    out = np.empty(len(c["tp"]))
    for tp in np.unique(c["tp"]):
        sel = c["tp"] == tp
        out[sel] = cm.all_reduce_time(gpu, c["nbytes"][sel], int(tp))
    return out


PREDICT: dict[str, Callable[[GpuSpec, dict[str, np.ndarray]], np.ndarray]] = {
    "gemm": _predict_gemm, "elementwise": _predict_elementwise, "attention_prefill": _predict_prefill,
    "attention_decode": _predict_decode, "all_reduce": _predict_all_reduce,
}


def relative_errors(table: Table, gpu: GpuSpec | None = None) -> np.ndarray:
    """|predicted - measured| / measured for every row of `table` (the built-in GPU by default)."""
    pred = PREDICT[table.family](gpu or get_gpu(table.gpu), table.columns)
    return np.abs(pred - table.measured_s) / table.measured_s


def error_report(tables: list[Table]) -> list[tuple[str, str, int, float, float]]:
    """(family, source, rows, median, p90) per table, then one `all` line per family."""
    lines, pooled = [], {}
    for t in sorted(tables, key=lambda t: (FAMILIES.index(t.family), t.source)):
        err = relative_errors(t)
        pooled.setdefault(t.family, []).append(err)
        lines.append((t.family, t.source, len(t), float(np.median(err)), float(np.percentile(err, 90))))
    for fam, errs in pooled.items():
        e = np.concatenate(errs)
        lines.append((fam, "all", len(e), float(np.median(e)), float(np.percentile(e, 90))))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profiles", type=Path, default=DEFAULT_PROFILES)
    ap.add_argument("--sample", type=int, default=0, help="at most N rows per table (0: all)")
    args = ap.parse_args(argv)
    if not args.profiles.is_dir():
        print(f"skip: {args.profiles} absent (the measured tables live in ../shared/data/profiles)")
        return 0
    try:
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError as exc:
        print(f"skip: {exc.name} is not installed (needed to read the tables)")
        return 0
    tables = load_tables(args.profiles)
    if args.sample:
        tables = [t.sample(args.sample) for t in tables]
    print(f"{'family':<18} {'source':<32} {'rows':>7} {'median':>8} {'p90':>8}")
    verdict = {}
    for fam, src, n, med, p90 in error_report(tables):
        print(f"{fam:<18} {src:<32} {n:>7} {med:>7.1%} {p90:>7.1%}")
        if src == "all":
            verdict[fam] = med
    print()
    for fam, med in verdict.items():
        ok = "meets" if med <= TARGET else "MISSES"
        print(f"{fam}: median {med:.1%} {ok} the <= {TARGET:.0%} target")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
