"""Routing passes over `cluster.route_step`: behaviour, the IR they leave, the pipeline checks."""

from __future__ import annotations

import numpy as np
import pytest

from schedir.dialects.cluster import RejectOp, ReplicateOp, RouteOp, TransferOp
from schedir.dialects.codes import Role, Why
from schedir.ir.errors import PipelineError
from schedir.ir.pipeline import PassManager
from schedir.ir.route_step import RouteStep, build_route_step, route_steps_of
from schedir.ir.textio import parse_step_text, print_ir
from schedir.tools.cli import EXIT_BAD_INPUT, EXIT_OK, main


def fleet(m: int, *, queued=None, running=None, free=None, role=None, position=None, **extra) -> dict:
    cols = {"id": np.arange(m), "role": np.asarray(role if role is not None else [0] * m),
            "queued": np.asarray(queued if queued is not None else [0] * m),
            "running": np.asarray(running if running is not None else [0] * m),
            "free_blocks": np.asarray(free if free is not None else [100] * m), "total_blocks": np.full(m, 100),
            "position": np.asarray(position if position is not None else [0] * m)}
    cols.update({k: np.asarray(v) for k, v in extra.items()})
    return cols


def arrivals(ids, prompt=1024, ttft_ms=0, tbt_ms=0) -> dict:
    ids = np.asarray(ids)
    k = ids.size
    return {"id": ids, "prompt": np.broadcast_to(np.asarray(prompt), (k,)).copy(), "output": np.full(k, 16),
            "ttft_slo_ms": np.full(k, ttft_ms), "tbt_slo_ms": np.full(k, tbt_ms)}


def route(pipeline: str, f: dict, a: dict, digest=None, prefix=None):
    module = build_route_step(0, 0, f, a, digest, prefix)
    PassManager.parse(pipeline, verify_each=True).run(module)
    module.verify()
    return module, RouteStep(route_steps_of(module)[0])


def decisions(module, kind):
    return [op for op in route_steps_of(module)[0].body.block.ops if type(op) is kind]


def routed(module) -> dict[int, int]:
    out = {}
    for op in decisions(module, RouteOp):
        out.update(zip(op.ids.tolist(), op.col("instance").tolist(), strict=True))
    return out


def test_round_robin_spreads_evenly():
    module, _ = route("round-robin", fleet(8), arrivals(range(80)))
    counts = np.bincount(list(routed(module).values()), minlength=8)
    assert counts.tolist() == [10] * 8
    assert set(decisions(module, RouteOp)[0].col("why").tolist()) == {int(Why.ROUND_ROBIN)}


def test_round_robin_skips_prefill_and_decode_only_instances():
    roles = [Role.BOTH, Role.PREFILL, Role.DECODE, Role.BOTH]
    module, _ = route("round-robin", fleet(4, role=[int(r) for r in roles]), arrivals(range(10)))
    assert set(routed(module).values()) == {0, 3}


def test_least_load_picks_the_emptiest_and_counts_what_it_placed():
    module, _ = route("least-load", fleet(4, queued=[5, 0, 3, 2], running=[5, 1, 0, 2]), arrivals([7]))
    assert routed(module) == {7: 1}
    # four arrivals: 1 (load 1 -> 2), then 1/... ties go to the lowest row
    module, _ = route("least-load", fleet(3, queued=[0, 0, 0], running=[4, 0, 1]), arrivals([1, 2, 3, 4]))
    assert list(routed(module).values()) == [1, 1, 2, 1]


def test_cache_aware_picks_the_instance_holding_the_prefix():
    digest = (np.array([2, 2, 2, 0]), np.array([11, 12, 13, 11]))
    prefix = (np.array([5, 5, 5]), np.array([11, 12, 13]))
    module, view = route("route-cache-aware", fleet(4, running=[0, 0, 3, 0]), arrivals([5], prompt=1536), digest,
                         prefix)
    assert routed(module) == {5: 2}
    op = decisions(module, RouteOp)[0]
    assert op.col("why").tolist() == [int(Why.CACHE)] and op.col("hit_blocks").tolist() == [3]
    assert view.prefix_hits().tolist() == [[1, 0, 3, 0]]


def test_cache_aware_falls_back_to_least_load_when_overloaded_or_a_small_hit():
    digest = (np.array([2]), np.array([11]))
    prefix = (np.array([5, 5, 5, 5]), np.array([11, 12, 13, 14]))
    busy = fleet(3, running=[20, 0, 40])
    module, _ = route("route-cache-aware", busy, arrivals([5], prompt=2048), digest, prefix)
    assert routed(module) == {5: 1}
    assert decisions(module, RouteOp)[0].col("why").tolist() == [int(Why.LEAST_LOAD)]
    module, _ = route("route-cache-aware{hit-threshold=0.5}", fleet(3), arrivals([5], prompt=2048), digest, prefix)
    assert routed(module) == {5: 0}  # 1 of 4 blocks: below the threshold, all loads equal


def test_sglang_router_balances_when_imbalanced():
    digest = (np.array([0, 0]), np.array([11, 12]))
    prefix = (np.array([5, 5]), np.array([11, 12]))
    module, _ = route("sglang-router", fleet(2, running=[3, 0]), arrivals([5], prompt=1024), digest, prefix)
    assert routed(module) == {5: 0}
    module, _ = route("sglang-router", fleet(2, running=[200, 0]), arrivals([5], prompt=1024), digest, prefix)
    assert routed(module) == {5: 1}


def test_slo_early_reject_fires_with_reason_slo():
    f = fleet(2, queued=[50, 50], running=[8, 8], queued_tokens=[500000, 500000])
    module, view = route("slo-early-reject,route-least-load", f, arrivals([1, 2], ttft_ms=[1000, 0]) |
                         {"ttft_slo_ms": np.array([1000, 0])})
    rejects = decisions(module, RejectOp)
    assert rejects[0].ids.tolist() == [1] and rejects[0].col("why").tolist() == [int(Why.SLO)]
    assert routed(module) == {2: 0}
    assert view.pending().size == 0


def test_pd_disaggregate_accounts_the_transfer():
    roles = [int(Role.PREFILL), int(Role.DECODE), int(Role.DECODE)]
    module, _ = route("pd-disaggregate", fleet(3, role=roles, position=[0, 1, 0], running=[0, 0, 5]),
                      arrivals([9], prompt=1000))
    op = decisions(module, RouteOp)[0]
    assert op.col("instance").tolist() == [0] and op.col("decode").tolist() == [1]
    t = decisions(module, TransferOp)[0]
    assert t.col("bytes").tolist() == [1000 * 131072]
    # across positions: 50 µs + 131 MB at 25 GB/s
    assert t.col("latency_us").tolist() == [int(np.ceil(50 + 1000 * 131072 / 25e3))]


def test_replicate_hot_prefix_then_route_to_the_replica():
    digest = (np.array([0, 0]), np.array([11, 12]))
    prefix = (np.repeat([1, 2, 3], 3), np.array([11, 12, 21, 11, 12, 22, 11, 12, 23]))
    module, _ = route("replicate-hot-prefix,route-cache-aware", fleet(3, running=[40, 10, 0]),
                      arrivals([1, 2, 3], prompt=1100), digest, prefix)
    rep = decisions(module, ReplicateOp)[0]
    assert rep.col("hash").tolist() == [12] and rep.col("dst").tolist() == [2]
    assert set(routed(module).values()) == {2}


def test_routed_step_prints_and_reparses():
    digest = (np.array([1]), np.array([11]))
    prefix = (np.array([3, 3]), np.array([11, 12]))
    module, _ = route("mooncake", fleet(3, running=[10, 0, 0]), arrivals([3, 4], ttft_ms=2000, tbt_ms=100),
                      digest, prefix)
    text = print_ir(module)
    again = parse_step_text(text)
    assert print_ir(again) == text


def test_pipeline_refuses_mixing_and_order():
    module = build_route_step(0, 0, fleet(2), arrivals([1]))
    with pytest.raises(PipelineError, match="cannot mix"):
        PassManager.parse("route-least-load,order-fcfs").run(module)
    with pytest.raises(PipelineError, match="requires 'routed'"):
        PassManager.parse("topology-distance").run(module)


def test_cli_lists_routing_passes_and_presets(capsys):
    assert main(["passes"]) == EXIT_OK
    out = capsys.readouterr().out
    for name in ("route-round-robin", "route-least-load", "route-cache-aware", "route-cache-balance",
                 "topology-distance", "replicate-hot-prefix", "pd-disaggregate", "slo-early-reject"):
        assert f"\n{name}\n" in out
    for preset in ("round-robin:", "least-load:", "mooncake:", "sglang-router:"):
        assert preset in out


def test_cli_opt_runs_a_router_preset_and_refuses_bad_options(capsys, tmp_path):
    path = tmp_path / "route.mlir"
    path.write_text(print_ir(build_route_step(1, 5, fleet(2, running=[3, 0]), arrivals([1, 2]))))
    assert main(["opt", str(path), "-p", "least-load"]) == EXIT_OK
    assert "cluster.route %req {id = [1, 2], instance = [1, 1]" in capsys.readouterr().out.replace("%1", "%req")
    assert main(["opt", str(path), "-p", "route-cache-aware{hit-threshold=3.0}"]) == EXIT_BAD_INPUT
    assert "hit-threshold must lie in [0, 1]" in capsys.readouterr().err


def test_a_router_preset_is_refused_as_an_engine_pipeline() -> None:
    from schedir import Scheduler, SchedulerConfig
    from schedir.ir.errors import PipelineError

    with pytest.raises(PipelineError, match=r"pipeline 'mooncake' routes requests over a fleet .*"
                                            r"schedir sim --instances N --router mooncake"):
        Scheduler(SchedulerConfig(pipeline="mooncake"))


def random_route_inputs(rng, step: int, router: str, *, arrivals_per_step: int, load: tuple[int, int],
                        whole_chains: bool = False):
    """A random routing step over 6 instances: the fleet, 1..`arrivals_per_step` arrivals with
    8-block chains from 3 families, and a digest: random holders per block, or (`whole_chains`)
    each chain held whole by one instance and one family by a second too."""
    m = 6
    k = 1 + step % arrivals_per_step
    f = fleet(m, queued=rng.integers(0, load[0], m), running=rng.integers(0, load[1], m),
              role=[1] + [2] * 5 if router == "mooncake-pd" else None, position=np.arange(m) // 3,
              queued_tokens=rng.integers(0, 60000 if load[0] < 10 else 200000, m),
              digest_blocks=rng.integers(0, 3000, m))
    a = arrivals(np.arange(step * 8, step * 8 + k), prompt=8 * 512 - 100, ttft_ms=2000, tbt_ms=100)
    chains = rng.integers(0, 3, k)[:, None] * 100 + np.arange(8)[None, :] + 1
    prefix = (np.repeat(a["id"], 8), chains.ravel())
    held = np.unique(chains)
    if not whole_chains:
        return f, a, (rng.integers(0, m, held.size), held), prefix
    extra = held[held // 100 == step % 3]
    return f, a, (np.concatenate([(held // 100 + step) % m, (extra // 100 + step + 1) % m]),
                  np.concatenate([held, extra])), prefix


@pytest.mark.parametrize("router", ["round-robin", "least-load", "mooncake", "sglang-router", "mooncake-pd"])
def test_recycled_route_step_gives_the_fresh_step_ir(router):
    """The fleet's refilled skeleton: after the pipeline, the same text as a freshly built step,
    step after step (the previous step's decisions gone), and it verifies and reloads."""
    from schedir.ir.route_step import RecycledRouteStep

    rng = np.random.default_rng(7)
    manager = PassManager.parse(router)
    skeleton = RecycledRouteStep()
    for step in range(12):
        f, a, digest, prefix = random_route_inputs(rng, step, router, arrivals_per_step=4, load=(8, 40))
        with_digest = None if step % 5 == 4 else digest  # a step of another layout rebuilds the skeleton
        fresh = build_route_step(step, step * 1000, f, a, with_digest, prefix)
        manager.run(fresh)
        again = skeleton.build(step, step * 1000, f, a, with_digest, prefix)
        manager.run(again)
        again.verify()
        assert print_ir(again) == print_ir(fresh)
    assert print_ir(parse_step_text(print_ir(again))) == print_ir(fresh)


@pytest.mark.parametrize("router", ["round-robin", "least-load", "mooncake", "sglang-router", "mooncake-pd",
                                    "replicate-hot-prefix{min-requests=1 overload-slack=0},route-cache-aware"])
def test_route_arrays_decide_as_the_ir(router):
    """The fleet's routing over arrays (`RouteArrays`, `PassManager.run_view`): the same decisions
    as the pipeline over the step's IR, step after step; its `to_module()` is that IR's text,
    verifies and reloads. Steps with replicas, rejections, transfers and no digest included."""
    from schedir.ir.route_arrays import RouteArrays

    rng = np.random.default_rng(11)
    manager = PassManager.parse(router)
    kinds = set()
    for step in range(40):
        f, a, digest, prefix = random_route_inputs(rng, step, router, arrivals_per_step=5, load=(30, 60),
                                                   whole_chains=True)
        digest = None if step % 7 == 6 else digest
        ir = build_route_step(step, step * 1000, f, a, digest, prefix)
        manager.run(ir)
        view = RouteArrays(step, step * 1000, f, a, digest, prefix)
        manager.run_view(view)
        out = view.to_module()
        out.verify()
        assert print_ir(out) == print_ir(ir), step
        (ir_step,) = route_steps_of(ir)
        expected = RouteStep(ir_step).decisions()
        got = view.decisions()
        assert [kind for kind, _ in got] == [kind for kind, _ in expected]
        for (_, a_cols), (_, b_cols) in zip(got, expected, strict=True):
            assert {n: v.tolist() for n, v in a_cols.items()} == {n: b_cols[n].tolist() for n in b_cols}
            assert all(v.dtype == np.int64 for v in a_cols.values())  # as the IR's columns
        kinds |= {kind.name for kind, _ in got}
    assert print_ir(parse_step_text(print_ir(out))) == print_ir(out)
    assert "cluster.route" in kinds
    if router.startswith("mooncake"):
        assert "cluster.reject" in kinds
    if router == "mooncake-pd":
        assert "cluster.transfer" in kinds
    if "replicate" in router:
        assert "cluster.replicate" in kinds


def test_a_whole_number_is_a_number_option():
    """`overload-slack=0` for a float option (xDSL's own parsing wanted `0.0` and printed a tuple)."""
    (p,) = PassManager.parse("route-cache-aware{overload-slack=0 hit-threshold=1}").passes
    assert (p.overload_slack, p.hit_threshold) == (0.0, 1.0) and type(p.overload_slack) is float


def test_run_view_takes_a_routing_pipeline():
    from schedir.ir.pipeline import PipelineError
    from schedir.ir.route_arrays import RouteArrays

    view = RouteArrays(0, 0, fleet(2), arrivals([1]))
    with pytest.raises(PipelineError, match="routing pipeline"):
        PassManager.parse("vllm").run_view(view)


def test_slo_miss_kernel_is_the_documented_prediction():
    """slo-early-reject's kernel against its formulas in numpy (per instance: TTFT = (queued +
    uncached tokens) / prefill rate, TBT = a decode step at running + 1; best over the instances
    that prefill / decode), on random fleets with every role: the same requests miss."""
    from schedir.passes.route_kernels import slo_miss_kernel

    rng = np.random.default_rng(1)
    for _ in range(300):
        k, m = int(rng.integers(1, 6)), int(rng.integers(1, 10))
        prompt, hits = rng.integers(1, 30000, k), rng.integers(0, 60, (k, m))
        queued, running, role = rng.integers(0, 200000, m), rng.integers(0, 300, m), rng.integers(0, 3, m)
        ttft, tbt, slack = rng.choice([0, 500, 2000], k), rng.choice([0, 10, 30, 100], k), float(rng.choice([0.7, 1.0]))
        rate, step_us, per_running_us = 55.3, 6931.7, 12.37
        ttft_ms = (queued[None, :] + np.maximum(prompt[:, None] - hits * 512, 1)) / rate / 1e3
        ttft_ms = np.where(role[None, :] != int(Role.DECODE), ttft_ms, np.inf).min(axis=1)
        tbt_ms = np.where(role != int(Role.PREFILL), (step_us + per_running_us * (running + 1)) / 1e3, np.inf).min()
        want = ((ttft * slack > 0) & (ttft_ms > ttft * slack)) | ((tbt * slack > 0) & (tbt_ms > tbt * slack))
        got = slo_miss_kernel(prompt, hits, queued, running, role, ttft, tbt, slack, 512, rate, step_us,
                              per_running_us, int(Role.PREFILL), int(Role.DECODE))
        np.testing.assert_array_equal(got, want)


LOWERED_ROUTERS = ["round-robin", "least-load", "mooncake", "sglang-router", "mooncake-pd",
                   "replicate-hot-prefix{min-requests=1 overload-slack=0},route-cache-aware",
                   "slo-early-reject{slack=0.5},route-least-load,topology-distance{inter-gbs=400}",
                   "route-cache-balance{balance-abs-threshold=4},topology-distance"]


@pytest.mark.parametrize("router", LOWERED_ROUTERS)
def test_the_lowered_router_decides_as_its_passes(router):
    """A routing pipeline lowered to one kernel (`RouteProgram`): step after step the decisions the
    passes give over arrays (`run_view`), in the same order, with the same columns and operands;
    its `to_module()` is the same IR text. Steps with and without a digest or prefix chains,
    whole-chain and scattered digests, batches of 1 to 5, every decision kind."""
    from schedir.ir.route_arrays import RouteArrays
    from schedir.lowering.route_program import RouteProgram

    rng = np.random.default_rng(23)
    manager = PassManager.parse(router)
    program = RouteProgram.lower(manager)
    assert program.passes == tuple(p.name for p in manager.passes)
    kinds = set()
    for step in range(120):
        f, a, digest, prefix = random_route_inputs(rng, step, router, arrivals_per_step=5,
                                                   load=(30, 60) if step % 3 else (4, 10), whole_chains=step % 2 == 0)
        digest = None if step % 7 == 6 else digest
        prefix = None if step % 11 == 10 else prefix
        view = RouteArrays(step, step * 1000, f, a, digest, prefix)
        manager.run_view(view)
        got = program.run(step, step * 1000, f, a, digest, prefix)
        want = [(kind, operand, {n: v.tolist() for n, v in cols.items()}) for kind, operand, cols in view.records]
        have = [(kind, operand, {n: v.tolist() for n, v in cols.items()}) for kind, operand, cols in got.records]
        assert have == want, step
        assert all(v.dtype == np.int64 for _, _, cols in got.records for v in cols.values())
        assert print_ir(got.to_module()) == print_ir(view.to_module()), step
        kinds |= {kind.name for kind, _, _ in got.records}
    assert "cluster.route" in kinds
    if router.startswith("mooncake") or router.startswith("slo"):
        assert "cluster.reject" in kinds
    if router == "mooncake-pd":
        assert "cluster.transfer" in kinds
    if "replicate" in router or "topology" in router:
        assert "cluster.replicate" in kinds


def test_a_pass_without_a_lowered_form_keeps_the_pipeline_pass_by_pass():
    """A routing pass with a rule of its own (here a subclass that overrides `run`) does not inherit
    its parent's kernel: the pipeline is not lowered, and the reason names the pass; an engine
    pipeline is no routing program; a fleet without a column the program reads is refused by name."""
    from dataclasses import dataclass
    from types import SimpleNamespace

    from schedir.lowering.route_program import NotLowered, RouteProgram, lower_router
    from schedir.passes.route_round_robin import RouteRoundRobin

    @dataclass(frozen=True)
    class EveryoneToTheFirst(RouteRoundRobin):
        def run(self, route) -> None:  # noqa: ANN001
            rows = route.pending()
            route.route(rows, np.zeros(rows.size, np.int64), Why.ROUND_ROBIN)

    manager = SimpleNamespace(passes=[EveryoneToTheFirst()], check=lambda facts: frozenset({"routed"}))
    assert lower_router(manager) is None
    with pytest.raises(NotLowered, match="pass 'route-round-robin' has no lowered form"):
        RouteProgram.lower(manager)
    with pytest.raises(NotLowered, match="routing pipeline"):
        RouteProgram.lower(PassManager.parse("vllm"))
    program = RouteProgram.lower(PassManager.parse("least-load"))
    with pytest.raises(ValueError, match="needs the fleet column 'queued_tokens'"):
        program.run(0, 0, fleet(3), arrivals([1, 2]))
    f = fleet(3, queued_tokens=[0, 0, 0], digest_blocks=[0, 0, 0])
    out = program.run(0, 0, f, arrivals([1, 2]))
    assert [(kind, cols["instance"].tolist()) for kind, cols in out.decisions()] == [(RouteOp, [0, 1])]


def test_the_lowered_router_takes_the_fleets_matrices():
    """`RouteProgram.decide` (the fleet's path) takes the columns as matrices in the layout's row
    order and decides as `run` over the same columns by name; a matrix of the wrong shape or
    kind is a ValueError naming the layout, and a ragged column set says which column."""
    from schedir.lowering import route_state as rs
    from schedir.lowering.route_program import RouteProgram, arrival_matrix, fleet_matrix

    program = RouteProgram.lower(PassManager.parse("mooncake"))
    f = fleet(3, queued_tokens=[0, 40000, 0], digest_blocks=[0, 2, 0])
    a = arrivals([5, 6])
    digest = (np.array([1, 1]), np.array([11, 12]))
    prefix = (np.array([5, 5, 6]), np.array([11, 12, 11]))
    out = program.run(0, 0, f, a, digest, prefix)
    by_name = [(k, {n: v.tolist() for n, v in c.items()}) for k, c in out.decisions()]
    got = program.decide(fleet_matrix(f), arrival_matrix(a), digest, prefix)
    assert [(k, c) for k, _, c in got] == by_name
    assert fleet_matrix(f).shape == (len(rs.FLEET_LAYOUT), 3)
    with pytest.raises(ValueError, match=r"fleet columns as an integer matrix of 9 rows \(id, role, queued"):
        program.decide(fleet_matrix(f)[:4], arrival_matrix(a))
    with pytest.raises(ValueError, match="arrival columns as an integer matrix"):
        program.decide(fleet_matrix(f), arrival_matrix(a).astype(np.float64))
    ragged = dict(f, running=np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="the fleet column 'running' has 2 rows, 'id' has 3"):
        fleet_matrix(ragged)


@pytest.mark.parametrize("router", ["round-robin", "least-load", "mooncake", "sglang-router", "mooncake-pd"])
def test_the_lowered_router_on_edge_steps(router):
    """No arrivals, a digest naming an instance not in the fleet, a fleet of one prefill
    instance (nobody can be served whole), empty prefix pairs: the lowered program decides as
    the passes do."""
    from schedir.ir.route_arrays import RouteArrays
    from schedir.lowering.route_program import RouteProgram

    three = fleet(3, queued_tokens=[0, 0, 0], digest_blocks=[0, 0, 0])
    none = np.zeros(0, np.int64)
    steps = [(three, arrivals([]), None, None),
             (three, arrivals([5, 6]), (np.array([0, 9]), np.array([11, 12])),
              (np.array([5, 5, 6]), np.array([11, 12, 11]))),
             (fleet(1, queued_tokens=[0], digest_blocks=[0], role=[1]), arrivals([1]), None, None),
             (three, arrivals([1, 2]), (none, none), (none, none))]
    manager = PassManager.parse(router)
    program = RouteProgram.lower(manager)
    for f, a, digest, prefix in steps:
        view = RouteArrays(0, 0, f, a, digest, prefix)
        manager.run_view(view)
        got = program.run(0, 0, f, a, digest, prefix)
        assert [(k, {n: v.tolist() for n, v in c.items()}) for k, c in got.decisions()] == \
            [(k, {n: v.tolist() for n, v in c.items()}) for k, c in view.decisions()]


def test_a_lowered_router_runs_its_own_generated_driver(tmp_path, monkeypatch):
    """`RouteProgram.lower` generates the pipeline's driver: a module under the cache folder of
    this version of the kernel sources that calls exactly the pipeline's passes' kernels, in
    order; written once and loaded again by the next process (not rewritten: Numba's cache keys
    on the file). With no writable cache folder it goes to a temporary one, same decisions."""
    import os
    import subprocess
    import sys

    from schedir import _kernel_cache
    from schedir.ir.route_arrays import RouteArrays
    from schedir.lowering import route_driver
    from schedir.lowering.route_program import LOWERED, RouteProgram

    program = RouteProgram.lower(PassManager.parse("mooncake"))
    source = route_driver.driver_source([LOWERED[c] for c in program.codes])
    calls = [line.split("(")[0].strip() for line in source.splitlines() if line.startswith("    pass")]
    imports = [line.split(" import ")[1] for line in source.splitlines() if " import " in line and "_lowered" in line]
    assert calls == ["pass0", "pass1", "pass2", "pass3"]
    assert imports == ["slo_early_reject_lowered as pass0", "replicate_hot_prefix_lowered as pass1",
                       "cache_aware_lowered as pass2", "topology_distance_lowered as pass3"]

    probe = ("from schedir.ir.pipeline import PassManager\n"
             "from schedir.lowering.route_program import RouteProgram\n"
             "import numpy as np\n"
             "p = RouteProgram.lower(PassManager.parse('round-robin'))\n"
             "f = {n: np.arange(4) for n in ('id', 'role', 'queued', 'running', 'free_blocks', 'total_blocks',"
             " 'position', 'queued_tokens', 'digest_blocks')}\n"
             "f['role'] = np.zeros(4, np.int64)\n"
             "a = {n: np.arange(3) for n in ('id', 'prompt', 'output', 'ttft_slo_ms', 'tbt_slo_ms')}\n"
             "print(p.run(0, 0, f, a).records[0][2]['instance'].tolist())\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "[0, 1, 2]"
    driver = tmp_path / "schedir" / "generated" / _kernel_cache.kernel_stamp()[:16] / "route_round_robin.py"
    assert driver.exists() and "pass0(F, A, P, S, options[0])" in driver.read_text()
    written = driver.stat().st_mtime_ns
    again = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
    assert driver.stat().st_mtime_ns == written

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setattr(route_driver, "generated_dir", lambda: blocked / "generated")  # mkdir fails under a file
    monkeypatch.setattr(route_driver, "_LOADED", {})
    manager = PassManager.parse("least-load")
    fallback = RouteProgram.lower(manager)
    assert "schedir-generated-" in fallback.kernel.py_func.__code__.co_filename
    rng = np.random.default_rng(5)
    for step in range(20):
        f, a, digest, prefix = random_route_inputs(rng, step, "least-load", arrivals_per_step=3, load=(4, 10))
        view = RouteArrays(step, step * 1000, f, a, digest, prefix)
        manager.run_view(view)
        got = fallback.run(step, step * 1000, f, a, digest, prefix)
        assert [(k, {n: v.tolist() for n, v in c.items()}) for k, _, c in got.records] == \
            [(k, {n: v.tolist() for n, v in c.items()}) for k, _, c in view.records]
