"""The fleet on Ray (`--backend ray`): the same decisions as in process, failures, the CLI.

A local Ray cluster is started here (module fixture) and shut down after; the tests that need
it skip with their reason where Ray is not installed (`pip install 'schedir[ray]'`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from schedir.sim.config import SimConfig
from schedir.sim.fleet import FleetConfig, FleetSimulator, Removal
from schedir.sim.metrics import summarize
from schedir.sim.workloads import builtin_workload
from schedir.tools.cli import EXIT_BAD_INPUT, EXIT_OK, main

ENGINE = SimConfig(num_blocks=4000)
ROOMY = SimConfig(num_blocks=40000)  # P/D: room for the prompts' KV on the decode instances
RECORDS = ("first_scheduled_s", "first_token_s", "last_token_s", "finish_s", "tokens_out", "prefix_hit_tokens",
           "preemptions")
WALL_KEYS = {"sim_wall_s", "scheduler_us_per_step", "scheduler_us", "scheduler_share_of_gpu_time"}
ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # the test's Ray binds the loopback address only


def test_ray_address_with_no_cluster_there_is_one_line(capsys, monkeypatch):
    """Runs first (before the module's cluster starts): `auto` finds no Ray cluster to join."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'schedir[ray]')")
    assert not ray.is_initialized()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    code = main(["sim", "--workload", "conversation", "--num-requests", "5", "--quiet", "--instances", "2",
                 "--backend", "ray", "--ray-address", "auto"])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT
    assert err.startswith("schedir sim: error: --ray-address 'auto': cannot connect to a Ray cluster")
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'schedir[ray]')")
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def backend(ray_cluster):
    from schedir.sim.ray_fleet import RayBackend

    b = RayBackend()  # joins the fixture's cluster; its actors serve every test of the module
    yield b
    b.shutdown()


@pytest.fixture(scope="module")
def workload():
    return builtin_workload("conversation", num_requests=200, rate=8.0, seed=3)


def assert_same_run(a, b) -> None:
    """Request for request: where each went, when each of its tokens came, and every figure."""
    np.testing.assert_array_equal(a.instance_of, b.instance_of)
    np.testing.assert_array_equal(a.finish_count, b.finish_count)
    ra, rb = a.result.requests, b.result.requests
    for name in RECORDS:
        np.testing.assert_array_equal(getattr(ra, name), getattr(rb, name), err_msg=name)
    assert ra.rejected == rb.rejected
    np.testing.assert_array_equal(ra.gaps(), rb.gaps())
    sa, sb = a.result.steps, b.result.steps
    timed = [i for i, f in enumerate(("start_s", "gpu_s", "prefill_tokens", "decode_tokens", "num_reqs",
                                      "num_waiting", "kv_usage", "sched_us", "flops")) if f != "sched_us"]
    np.testing.assert_array_equal(sa._rows[: sa.size, timed], sb._rows[: sb.size, timed])
    ma, mb = summarize(a.result), summarize(b.result)
    for key in WALL_KEYS:
        ma.pop(key), mb.pop(key)
    assert ma == mb
    for key in ("why", "routed", "route_steps", "replicas", "migrations", "transfers", "rerouted", "per_instance",
                "copied_blocks", "copy_skipped"):
        assert a.fleet[key] == b.fleet[key], key


def assert_conserved(out, n: int) -> None:
    """Every request finished exactly once or carries a reason; none finished twice."""
    r = out.result.requests
    finished = ~np.isnan(r.finish_s)
    rejected = np.zeros(n, dtype=bool)
    rejected[list(r.rejected)] = True
    assert not (finished & rejected).any(), "a request both finished and rejected"
    assert (finished | rejected).all(), f"lost: {np.flatnonzero(~(finished | rejected))[:10]}"
    assert out.finish_count.max() <= 1, "a request finished twice"
    assert (out.finish_count[finished] == 1).all()
    assert (r.tokens_out[finished] == r.output_len[finished]).all()
    assert all(r.rejected[i] for i in np.flatnonzero(rejected).tolist())


@pytest.mark.parametrize("router", ["round-robin", "mooncake"])
def test_ray_decides_as_in_process(backend, workload, router):
    fleet = FleetConfig(instances=4, router=router)
    local = FleetSimulator(ENGINE, fleet).run(workload)
    remote = FleetSimulator(ENGINE, fleet, backend).run(workload)
    assert_same_run(local, remote)
    assert len(set(local.instance_of.tolist()) - {-1}) == 4  # the workload spread over the fleet
    if router == "mooncake":  # hot prefixes were copied between pools, on the actors as in process
        assert local.fleet["copied_blocks"] > 0
    assert_conserved(remote, len(workload))


def test_ray_decides_as_in_process_with_prefill_and_decode_instances(backend, workload):
    fleet = FleetConfig(instances=4, router="mooncake-pd", prefill_instances=1)
    w = workload.head(120)
    local = FleetSimulator(ROOMY, fleet).run(w)
    remote = FleetSimulator(ROOMY, fleet, backend).run(w)
    assert local.fleet["transfers"] > 50  # requests did move from the prefill to a decode instance
    assert_same_run(local, remote)
    assert_conserved(remote, len(w))


def test_killed_actor_requests_are_rerouted_once(backend, workload):
    """`--kill-instance 1@8`: ray.kill on instance 1's actor at 8 simulated seconds. The router
    re-routes what it had sent there and not seen settle: the same run as draining it then."""
    kill = FleetConfig(instances=4, router="least-load", removals=(Removal(8.0, 1, kill=True),))
    out = FleetSimulator(ENGINE, kill, backend).run(workload)
    assert out.fleet["lost"] == [1] and out.fleet["rerouted"] > 0
    assert not out.fleet["per_instance"][1]["alive"]
    assert_conserved(out, len(workload))
    late = (out.instance_of == 1) & (out.result.requests.finish_s > 8.0)
    assert not late.any(), "a request finished on the killed instance after it died"
    drained = FleetSimulator(ENGINE, attrs_evolve_removal(kill, kill=False)).run(workload)
    assert_same_run(drained, out)


def attrs_evolve_removal(fleet: FleetConfig, kill: bool) -> FleetConfig:
    import attrs

    return attrs.evolve(fleet, removals=tuple(attrs.evolve(r, kill=kill) for r in fleet.removals))


def test_actor_dying_unannounced_mid_run(backend, workload):
    """An actor killed from outside the router (as a crashed node would be): the next call on it
    fails, and the router re-routes its requests from then on; nothing lost, nothing twice."""
    ray = pytest.importorskip("ray")
    fleet = FleetConfig(instances=3, router="round-robin")
    killed: list[float] = []

    def crash(done: int, total: int, now: float) -> None:
        if not killed and done >= 40:
            ray.kill(backend.pool[2], no_restart=True)
            killed.append(now)

    out = FleetSimulator(ENGINE, fleet, backend).run(workload, progress=crash, progress_every=20)
    assert killed and out.fleet["lost"] == [2]
    assert out.fleet["rerouted"] > 0
    assert_conserved(out, len(workload))
    assert out.fleet["per_instance"][2]["routed"] < len(workload) / 3  # it took no more after it was found dead
    assert len(backend.pool) >= 2  # the dead actor left the pool; the next run starts a fresh one
    ray.kill(backend.pool[0], no_restart=True)  # one dying between runs is replaced too
    again = FleetSimulator(ENGINE, fleet, backend).run(workload.head(30))
    assert not again.fleet["lost"]
    assert_conserved(again, 30)


def test_an_instance_error_is_raised_as_in_process(backend, workload):
    """A bad engine pipeline fails inside each actor: the driver raises the instance's own error."""
    from schedir.ir.errors import PipelineError

    fleet = FleetConfig(instances=2, router="round-robin")
    with pytest.raises(PipelineError, match="unknown pass 'nope'") as local:
        FleetSimulator(SimConfig(pipeline="nope"), fleet).run(workload.head(5))
    with pytest.raises(PipelineError, match="unknown pass 'nope'") as remote:
        FleetSimulator(SimConfig(pipeline="nope"), fleet, backend).run(workload.head(5))
    assert str(remote.value) == str(local.value)


def test_cli_backend_ray_prints_the_local_figures(ray_cluster, tmp_path, capsys):
    args = ["sim", "--workload", "conversation", "--num-requests", "60", "--instances", "3", "--router", "mooncake",
            "--num-blocks", "4000", "--quiet", "--kill-instance", "2@5"]
    runs = {}
    for name in ("local", "ray"):
        out = tmp_path / f"{name}.json"
        assert main([*args, "--backend", name, "--json", str(out)]) == EXIT_OK
        runs[name] = json.loads(out.read_text())
    capsys.readouterr()
    for m in runs.values():
        for key in WALL_KEYS:
            m.pop(key)
        for key in ("route_us_per_request", "pipeline_us_per_request"):
            m["fleet"].pop(key)
    assert runs["local"]["fleet"]["lost"] == [2]
    assert runs["local"] == runs["ray"]


def test_cli_backend_errors_are_one_line(capsys, monkeypatch):
    base = ["sim", "--workload", "conversation", "--num-requests", "5", "--quiet"]
    cases = [
        (["--backend", "ray"], "--backend needs --instances N"),
        (["--instances", "2", "--backend", "slurm"], "--backend 'slurm': expected local or ray"),
        (["--instances", "2", "--ray-address", "auto"], "--ray-address 'auto' needs --backend ray"),
        (["--instances", "2", "--kill-instance", "2@1"], "--kill-instance 2@1: the fleet has instances 0..1"),
        (["--instances", "2", "--kill-instance", "1"], "--kill-instance '1': expected INSTANCE@SECONDS"),
        (["--instances", "2", "--kill-instance", "1@1", "--remove-instance", "1@2"], "an instance is removed twice"),
        (["--instances", "2", "--instance-engine", "vllm"], "--instance-engine vllm needs --backend ray"),
        (["--instances", "2", "--instance-engine", "gpu"], "--instance-engine 'gpu': expected sim or vllm"),
        (["--instance-engine", "vllm"], "--instance-engine needs --instances N"),
    ]
    for argv, message in cases:
        code = main([*base, *argv])
        err = capsys.readouterr().err
        assert code == EXIT_BAD_INPUT, argv
        assert message in err and "Traceback" not in err and err.count("\n") == 1, err
    if "ray" in sys.modules:  # a vLLM instance's settings are checked before anything starts
        code = main([*base, "--instances", "2", "--backend", "ray", "--instance-engine", "vllm"])
        err = capsys.readouterr().err
        assert code == EXIT_BAD_INPUT and "--instance-engine vllm needs --block-size 32" in err
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    code = main([*base, "--instances", "2", "--backend", "ray"])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT and "Ray is not installed" in err and "pip install" in err


def test_decode_actor_dying_mid_run_with_prefill_and_decode_instances(backend, workload):
    """P/D: a decode instance's actor dies unannounced while prefills hand requests over to it.
    What it held and the transfers still on their way to it are routed again; none is lost."""
    ray = pytest.importorskip("ray")
    fleet = FleetConfig(instances=4, router="mooncake-pd", prefill_instances=1)
    w = workload.head(120)
    killed: list[float] = []

    def crash(done: int, total: int, now: float) -> None:
        if not killed and done >= 20:
            ray.kill(backend.pool[2], no_restart=True)
            killed.append(now)

    out = FleetSimulator(ROOMY, fleet, backend).run(w, progress=crash, progress_every=10)
    assert killed and out.fleet["lost"] == [2] and out.fleet["rerouted"] > 0
    assert_conserved(out, len(w))
    r = out.result.requests
    finished = ~np.isnan(r.finish_s)
    assert not ((out.instance_of == 2) & finished & (r.finish_s > killed[0] + 1.0)).any()
