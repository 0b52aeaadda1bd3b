"""The simulator's event loop, metrics and bench config specs (behaviour, never wall-clock)."""

from __future__ import annotations

import json
import math

import attrs
import numpy as np
import pytest

from schedir.ir.errors import PipelineError
from schedir.sim.config import SimConfig
from schedir.sim.cost_model import CostModel
from schedir.sim.metrics import summarize
from schedir.sim.runspec import ConfigSpecError, parse_configs, parse_item
from schedir.sim.simulator import Simulator
from schedir.sim.workloads import Workload, builtin_workload

REQUIRED_KEYS = ("ttft_s", "tbt_s", "e2e_s", "throughput_req_s", "throughput_tok_s", "prefix_hit_rate",
                 "batch_efficiency", "kv_utilization", "preemptions", "scheduler_us_per_step", "sim_wall_s")


def workload(arrivals, inputs, outputs, priority=None, shared_blocks: int = 0) -> Workload:
    """A hand-made trace; the first `shared_blocks` 512-token blocks are common to every request."""
    n = len(arrivals)
    inputs = np.asarray(inputs, dtype=np.int64)
    counts = -(-inputs // 512)
    offsets = np.concatenate(([0], np.cumsum(counts)))
    ids = []
    fresh = 1000
    for c in counts.tolist():
        for b in range(c):
            if b < shared_blocks:
                ids.append(b)
            else:
                ids.append(fresh)
                fresh += 1
    return Workload(name="hand", source="test", arrival_s=np.asarray(arrivals, dtype=np.float64), input_len=inputs,
                    output_len=np.asarray(outputs, dtype=np.int64),
                    priority=np.zeros(n, np.int64) if priority is None else np.asarray(priority, np.int64),
                    block_offsets=offsets, block_ids=np.asarray(ids, dtype=np.int64))


def test_one_request_times_are_the_cost_models_step_times():
    config = SimConfig(model="llama-3-8b", gpu="h100")
    result = Simulator(config).run(workload([0.0], [100], [4]))
    cost = CostModel.create("llama-3-8b", "h100")
    prefill = cost.step_time(np.array([100]), np.array([0]))
    decodes = [cost.step_time(np.array([1]), np.array([c])) for c in (100, 101, 102)]
    r = result.requests
    assert r.first_token_s[0] == pytest.approx(prefill)
    assert r.finish_s[0] == pytest.approx(prefill + sum(decodes))
    assert r.tokens_out[0] == 4
    assert np.allclose(r.gaps(), decodes)
    m = summarize(result)
    assert m["ttft_s"]["p50"] == pytest.approx(prefill)
    assert m["e2e_s"]["p50"] == pytest.approx(prefill + sum(decodes))
    assert m["steps"] == 4 and m["requests"]["finished"] == 1


def test_idle_engine_jumps_to_the_next_arrival():
    result = Simulator(SimConfig()).run(workload([0.0, 100.0], [64, 64], [2, 2]))
    r = result.requests
    assert r.first_scheduled_s[1] == pytest.approx(100.0)
    assert r.first_token_s[1] - r.arrival_s[1] < 1.0
    assert result.steps.size == 4


def test_builtin_workload_drains_with_consistent_metrics():
    w = builtin_workload("conversation", num_requests=60, seed=3)
    result = Simulator(SimConfig()).run(w)
    m = summarize(result)
    r = result.requests
    assert m["requests"] == {"total": 60, "finished": 60, "rejected": 0, "unfinished": 0}
    assert np.array_equal(r.tokens_out, w.output_len)
    assert np.all(r.arrival_s <= r.first_scheduled_s)
    assert np.all(r.first_scheduled_s < r.first_token_s)
    assert np.all(r.first_token_s <= r.finish_s)
    assert m["tbt_s"]["count"] == int((w.output_len - 1).sum())
    for key in REQUIRED_KEYS:
        assert key in m
    for key in ("ttft_s", "tbt_s", "e2e_s"):
        assert m[key]["p50"] <= m[key]["p90"] <= m[key]["p99"]
    assert 0 < m["goodput_req_s"] <= m["throughput_req_s"]
    assert 0 < m["batch_efficiency"] <= 1 and 0 < m["kv_utilization"] <= 1 and 0 < m["compute_efficiency"] <= 1
    assert m["prefix_hit_rate"] > 0  # multi-turn conversations share prefixes
    assert m["scheduler_us_per_step"] > 0
    json.loads(json.dumps(m))  # the metrics JSON is plain data


def test_runs_are_deterministic_apart_from_wall_time():
    w = builtin_workload("conversation", num_requests=40, seed=1)
    a, b = (summarize(Simulator(SimConfig()).run(w)) for _ in range(2))
    for key in ("ttft_s", "tbt_s", "e2e_s", "throughput_req_s", "prefix_hit_rate", "steps", "preemptions"):
        assert a[key] == b[key]


def test_prefix_caching_saves_gpu_time_on_shared_prefixes():
    w = workload(np.arange(20) * 0.05, [4096] * 20, [8] * 20, shared_blocks=7)
    on = summarize(Simulator(SimConfig()).run(w))
    off = summarize(Simulator(SimConfig(enable_prefix_caching=False)).run(w))
    assert on["prefix_hit_rate"] > 0.7 and off["prefix_hit_rate"] == 0
    assert on["gpu_busy_s"] < off["gpu_busy_s"]
    assert on["ttft_s"]["p50"] < off["ttft_s"]["p50"]


def test_small_cache_preempts_and_still_finishes_everything():
    w = workload(np.zeros(12), [1000] * 12, [300] * 12)
    m = summarize(Simulator(SimConfig(num_blocks=400)).run(w))
    assert m["preemptions"] > 0
    assert m["requests"]["finished"] == 12


def test_too_long_requests_are_rejected_with_their_reason_and_the_rest_finish():
    w = workload([0.0, 0.0, 0.1], [200, 5000, 200], [4, 4, 4])
    result = Simulator(SimConfig(max_model_len=2048)).run(w)
    m = summarize(result)
    assert result.requests.rejected == {1: "too-long"}
    assert m["requests"]["finished"] == 2 and m["rejected_reasons"] == {"too-long": 1}


def test_a_pipeline_that_never_admits_is_reported_stalled():
    w = workload([0.0], [64], [2])
    result = Simulator(SimConfig(pipeline="reject-oversized,order-fcfs,schedule-running")).run(w)
    assert result.stalled is not None and "scheduled nothing" in result.stalled and "0" in result.stalled


def test_priority_policy_serves_urgent_requests_first():
    n = 24
    w = workload(np.zeros(n), [3000] * n, [50] * n, priority=[1] * (n - 4) + [0] * 4)
    fcfs = Simulator(SimConfig(max_num_batched_tokens=2048)).run(w).requests
    prio = Simulator(SimConfig(max_num_batched_tokens=2048, policy="priority")).run(w).requests
    urgent = slice(n - 4, n)
    assert np.nanmean(prio.first_token_s[urgent]) < np.nanmean(fcfs.first_token_s[urgent])


def test_runtime_metrics_use_the_simulated_clock():
    w = workload([0.0, 0.5], [300, 300], [10, 10])
    result = Simulator(SimConfig()).run(w)
    runtime = result.runtime_metrics
    e2e = result.requests.finish_s - result.requests.arrival_s
    assert runtime["total_requests"] == 2
    assert runtime["avg_latency_s"] == pytest.approx(float(e2e.mean()))


def test_live_dumps_from_a_simulation(tmp_path):
    w = workload([0.0], [100], [3])
    Simulator(SimConfig(dump_dir=tmp_path, dump_steps=(2,))).run(w)
    names = sorted(p.name for p in tmp_path.glob("*.mlir"))
    assert names and all(name.startswith("step-00002-") for name in names)


def test_unknown_model_or_gpu_is_refused_with_the_known_names():
    with pytest.raises(ValueError, match="llama-3-8b"):
        Simulator(SimConfig(model="llama-9"))
    with pytest.raises(ValueError, match="h100"):
        Simulator(SimConfig(gpu="tpu"))


def test_prefix_caching_defaults_to_the_engines_own():
    """Unset, the prefix cache is on, but for the vllm-v0 presets: v0's engine runs without it
    (`StepPass.v0_prefix_cache`), and for the chunked, priority and swap ones schedir does not
    reproduce v0's (`StepPass.no_prefix_cache`), so `schedir bench --configs vllm,vllm-v0` runs as
    written; set, it is as set (on: `vllm-v0` caches v0's way, the others refuse it clearly); a
    run's record shows what was run."""
    assert SimConfig().prefix_caching and SimConfig(pipeline="fastserve").prefix_caching
    assert not SimConfig(pipeline="vllm-v0").prefix_caching
    assert not SimConfig(pipeline="order-vllm,v0-prefills,v0-running,v0-swapped").prefix_caching
    assert not SimConfig(enable_prefix_caching=False).prefix_caching
    assert SimConfig(pipeline="vllm-v0", enable_prefix_caching=True).prefix_caching
    assert SimConfig(pipeline="no-such-pass").prefix_caching  # (the runtime names the bad pass)
    on, v0 = parse_configs("vllm,vllm-v0", SimConfig())
    assert on.scheduler_config(64, 256).enable_prefix_caching and not v0.scheduler_config(64, 256).enable_prefix_caching
    assert v0.recorded()["enable_prefix_caching"] is False and on.recorded()["enable_prefix_caching"] is True
    w = builtin_workload("chat-short", num_requests=12, rate=4.0, seed=3)
    result = Simulator(v0).run(w)
    assert result.config["enable_prefix_caching"] is False and result.requests.arrival_s.size == 12
    cached = Simulator(SimConfig(pipeline="vllm-v0", enable_prefix_caching=True)).run(w)
    assert cached.config["enable_prefix_caching"] is True and cached.requests.arrival_s.size == 12
    with pytest.raises(PipelineError, match="prefix caching off"):
        Simulator(SimConfig(pipeline="vllm-v0-swap", enable_prefix_caching=True)).run(w)


def test_config_specs():
    base = SimConfig(max_num_batched_tokens=4096)
    configs = parse_configs("vllm,vllm@policy=priority@max_num_seqs=64,vllm@enable_prefix_caching=off", base)
    assert [c.name for c in configs] == ["vllm", "vllm@policy=priority@max_num_seqs=64",
                                        "vllm@enable_prefix_caching=off"]
    assert configs[1].policy == "priority" and configs[1].max_num_seqs == 64
    assert configs[1].max_num_batched_tokens == 4096
    assert configs[2].enable_prefix_caching is False
    pipeline = parse_item("reject-oversized+order-vllm+vllm-schedule-running+vllm-admit", base)
    assert pipeline.pipeline == "reject-oversized,order-vllm,vllm-schedule-running,vllm-admit"
    semi = parse_configs("vllm;reject-oversized,order-fcfs,schedule-running,admit-greedy", base)
    assert semi[1].pipeline == "reject-oversized,order-fcfs,schedule-running,admit-greedy"


@pytest.mark.parametrize("text, message", [
    ("vllm@colour=red", "unknown field 'colour'"),
    ("vllm@policy", "not field=value"),
    ("vllm@max_num_seqs=many", "max_num_seqs='many'"),
    ("vllm@policy=sjf", "policy must be one of"),
    ("vllm,,base", "empty item"),
    ("vllm,vllm", "the same config twice"),
    ("vllm@enable_prefix_caching=maybe", "expected true or false"),
])
def test_bad_config_specs_say_what_is_wrong(text, message):
    with pytest.raises(ConfigSpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_configs(text, SimConfig())


def test_sim_config_validates():
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        SimConfig(gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="policy"):
        SimConfig(policy="lifo")
    assert attrs.evolve(SimConfig(), label="x").name == "x"
    assert not math.isnan(SimConfig().ttft_slo_s)


def test_swapping_pipelines_pay_for_their_copies_over_pcie():
    """vllm-v0-swap preempts by swap to the host tier; each copy costs its bytes at the host link's
    rate, so the same trace takes longer than if the copies were free, and everything finishes."""
    cost = CostModel.create("llama-3-8b", "h100")
    per_block = 16 * 2 * 2 * 8 * 128 * 32  # tokens x (K, V) x bf16 x kv heads x head dim x layers
    assert cost.swap_time(10, 16) == pytest.approx(10 * per_block / 64e9)
    assert cost.host_blocks(4.0, 16) == (4 << 30) // per_block
    w = workload(np.zeros(12), [1000] * 12, [300] * 12)
    cfg = SimConfig(num_blocks=400, pipeline="vllm-v0-swap", enable_prefix_caching=False)
    swapped = Simulator(cfg).run(w)
    m = summarize(swapped)
    assert m["preemptions"] > 0 and m["requests"]["finished"] == 12
    recompute = Simulator(attrs.evolve(cfg, swap_space_gib=0.0, pipeline="vllm-v0")).run(w)  # no host space
    assert summarize(recompute)["requests"]["finished"] == 12
    original = CostModel.swap_time
    try:
        CostModel.swap_time = lambda self, blocks, block_size: 0.0  # type: ignore[method-assign]
        free_copies = Simulator(cfg).run(w)
    finally:
        CostModel.swap_time = original  # type: ignore[method-assign]
    assert summarize(free_copies)["preemptions"] == m["preemptions"]
    assert summarize(swapped)["simulated_s"] > summarize(free_copies)["simulated_s"]
    with pytest.raises(ValueError, match="swap_space_gib"):
        cost.host_blocks(-1.0, 16)
