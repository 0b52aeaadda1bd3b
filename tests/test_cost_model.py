"""The simulator's cost model: behaviour on built-in models, and its error against ../shared's tables."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from schedir.sim.cost_model import BREAKDOWN_KEYS, CostModel
from schedir.sim.models import GPUS, MODELS, ModelSpec, get_gpu, get_model

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT.parent / "shared" / "data" / "profiles"


def arr(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int64)


@pytest.fixture(scope="module")
def llama8b() -> CostModel:
    return CostModel.create("llama-3-8b", "h100")


def test_registries_and_unknown_names() -> None:
    assert set(MODELS) == {"llama-3-8b", "llama-2-7b", "llama-2-70b"}
    assert set(GPUS) == {"h100", "a100"}
    assert get_model("Llama-3-8B").max_model_len == 131072
    assert get_model("llama-2-70b").num_kv_heads == 8
    with pytest.raises(ValueError, match="did you mean 'llama-3-8b'"):
        get_model("llama-3-8")
    with pytest.raises(ValueError, match="a100, h100"):
        get_gpu("v100")
    with pytest.raises(ValueError, match="known models"):
        CostModel.create("gpt-5", "h100")


def test_tp_validation() -> None:
    with pytest.raises(ValueError, match="tp must be one of"):
        CostModel.create("llama-2-70b", "h100", tp=3)
    odd = ModelSpec("odd", num_layers=2, hidden_size=384, num_heads=6, num_kv_heads=3, head_dim=64,
                    intermediate_size=1024, vocab_size=100, max_model_len=128)
    with pytest.raises(ValueError, match="divide"):
        CostModel(odd, get_gpu("h100"), tp=2)
    CostModel.create("llama-2-70b", "a100", tp=4)
    CostModel.create("llama-2-7b", "a100", tp=2)


def test_empty_batch(llama8b: CostModel) -> None:
    empty = arr()
    assert llama8b.step_time(empty, empty) == 0.0
    assert llama8b.flops(empty, empty) == 0.0
    assert sum(llama8b.breakdown(empty, empty).values()) == 0.0


def test_monotonic_in_tokens_and_context(llama8b: CostModel) -> None:
    times = [llama8b.step_time(arr(n), arr(0)) for n in (1, 16, 128, 512, 2048, 8192)]
    assert times == sorted(times) and len(set(times)) == len(times)
    ctx = [llama8b.step_time(arr(1, 1), arr(c, c)) for c in (0, 1000, 10000, 100000)]
    assert ctx == sorted(ctx) and len(set(ctx)) == len(ctx)
    chunk = [llama8b.step_time(arr(512), arr(c)) for c in (0, 4096, 32768)]
    assert chunk == sorted(chunk) and len(set(chunk)) == len(chunk)
    batch = [llama8b.step_time(np.ones(n, np.int64), np.full(n, 1000, np.int64)) for n in (1, 8, 64, 256)]
    assert batch == sorted(batch)


def test_decode_much_cheaper_than_long_prefill(llama8b: CostModel) -> None:
    decode = llama8b.step_time(np.ones(32, np.int64), np.full(32, 1000, np.int64))
    prefill = llama8b.step_time(arr(8192), arr(0))
    assert prefill > 5 * decode
    # a lone decode step is memory-bound on the weights (~16 GB at ~3 TB/s)
    assert 3e-3 < llama8b.step_time(arr(1), arr(100)) < 15e-3


def test_tensor_parallel_and_model_size() -> None:
    tp2 = CostModel.create("llama-2-70b", "h100", tp=2).step_time(arr(4096), arr(0))
    tp4 = CostModel.create("llama-2-70b", "h100", tp=4).step_time(arr(4096), arr(0))
    assert tp4 < tp2 < 4 * tp4
    small = CostModel.create("llama-3-8b", "h100").step_time(arr(4096), arr(0))
    assert small < tp2
    assert CostModel.create("llama-3-8b", "a100").step_time(arr(4096), arr(0)) > small
    assert CostModel.create("llama-2-70b", "h100", tp=4).breakdown(arr(4096), arr(0))["all_reduce"] > 0
    assert CostModel.create("llama-3-8b", "h100").breakdown(arr(4096), arr(0))["all_reduce"] == 0


def test_breakdown_sums_to_step_time(llama8b: CostModel) -> None:
    tokens, context = arr(1, 1, 1, 512, 3000), arr(10, 500, 9000, 0, 2048)
    parts = llama8b.breakdown(tokens, context)
    assert tuple(parts) == BREAKDOWN_KEYS
    assert all(v >= 0 for v in parts.values())
    assert parts["attention_prefill"] > 0 and parts["attention_decode"] > 0
    assert sum(parts.values()) == pytest.approx(llama8b.step_time(tokens, context), rel=1e-12)
    with pytest.raises(ValueError):
        llama8b.step_time(arr(1, 1), arr(0))


def test_flops_of_prefill_near_two_params_per_token(llama8b: CostModel) -> None:
    params = get_model("llama-3-8b").num_params
    assert 7.9e9 < params < 8.1e9
    tokens = 2048
    assert llama8b.flops(arr(tokens), arr(0)) == pytest.approx(2 * params * tokens, rel=0.2)
    assert llama8b.peak_flops == pytest.approx(989e12)
    assert CostModel.create("llama-2-70b", "h100", tp=4).peak_flops == pytest.approx(4 * 989e12)


def test_kv_cache_blocks(llama8b: CostModel) -> None:
    assert llama8b.kv_bytes_per_token == 128 * 1024
    # (79.2 GiB x 0.9 - 14.96 GiB weights - 2 GiB reserve) / 2 MiB per block of 16 = 27,813
    blocks = llama8b.kv_cache_blocks(16, 0.9)
    assert 20_000 <= blocks <= 40_000
    assert blocks == 27_813
    assert llama8b.kv_cache_blocks(32) == pytest.approx(blocks / 2, abs=1)
    assert llama8b.kv_cache_blocks(16, 0.5) < blocks
    tp2 = CostModel.create("llama-2-70b", "h100", tp=2).kv_cache_blocks(16)
    tp4 = CostModel.create("llama-2-70b", "h100", tp=4).kv_cache_blocks(16)
    assert 0 < tp2 < tp4
    assert CostModel.create("llama-2-70b", "h100", tp=1).kv_cache_blocks(16) == 0  # 138 GB of weights


def _error_module():
    spec = importlib.util.spec_from_file_location("cost_model_error", ROOT / "benchmarks" / "cost_model_error.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_error_against_measured_tables() -> None:
    if not PROFILES.is_dir():
        pytest.skip("../shared/data/profiles absent: the measured tables are not part of the project")
    pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    bench = _error_module()
    tables = [t.sample(400, seed=1) for t in bench.load_tables(PROFILES)]
    assert {t.family for t in tables} == set(bench.FAMILIES)
    pooled = {}
    for t in tables:
        pooled.setdefault(t.family, []).append(bench.relative_errors(t))
    for family, errs in pooled.items():
        median = float(np.median(np.concatenate(errs)))
        assert median <= 0.10, f"{family}: median relative error {median:.1%}"


@pytest.mark.parametrize("model, gpu, tp", [("llama-3-8b", "h100", 1), ("llama-2-70b", "a100", 2),
                                            ("llama-2-70b", "h100", 4)])
def test_step_cost_is_step_time_and_flops_in_one_call(model, gpu, tp):
    cost = CostModel.create(model, gpu, tp)
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 300))
        num_tokens = np.where(rng.random(n) < 0.7, 1, rng.integers(1, 3000, n)).astype(np.int64)
        context = rng.integers(0, 60000, n).astype(np.int64)
        seconds, flops = cost.step_cost(num_tokens, context)  # twice: the memoised parts must agree too
        assert cost.step_cost(num_tokens, context) == (seconds, flops)
        assert seconds == pytest.approx(cost.step_time(num_tokens, context), rel=1e-12)
        assert flops == pytest.approx(cost.flops(num_tokens, context), rel=1e-12)
    assert cost.step_cost(np.zeros(0, np.int64), np.zeros(0, np.int64)) == (0.0, 0.0)
