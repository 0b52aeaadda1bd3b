"""The multi-instance simulator: conservation, routing behaviour, instance removal, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from schedir.sim.config import SimConfig
from schedir.sim.fleet import FleetConfig, FleetSimulator, Removal, chain_hashes, parse_removal
from schedir.sim.metrics import summarize
from schedir.sim.workloads import Workload, builtin_workload
from schedir.tools.cli import EXIT_BAD_INPUT, EXIT_OK, main

ENGINE = SimConfig(num_blocks=4000)


@pytest.fixture(scope="module")
def workload():
    return builtin_workload("conversation", num_requests=80, rate=6.0, seed=1)


def run(workload, router: str, instances: int = 4, removals=(), prefill_instances: int = 0):
    fleet = FleetConfig(instances=instances, router=router, removals=tuple(removals),
                        prefill_instances=prefill_instances)
    return FleetSimulator(ENGINE, fleet).run(workload)


def assert_conserved(out, n: int) -> None:
    r = out.result.requests
    finished = ~np.isnan(r.finish_s)
    rejected = np.zeros(n, dtype=bool)
    rejected[list(r.rejected)] = True
    assert not (finished & rejected).any(), "a request both finished and rejected"
    assert (finished | rejected).all(), "a request was lost"
    assert out.finish_count.max() <= 1, "a request finished twice"
    assert (out.finish_count[finished] == 1).all()
    assert (r.tokens_out[finished] == r.output_len[finished]).all()


@pytest.mark.parametrize("router", ["round-robin", "least-load", "mooncake", "sglang-router"])
def test_every_request_finishes_or_is_rejected_once(workload, router):
    out = run(workload, router)
    assert_conserved(out, len(workload))
    assert out.result.stalled is None


def test_round_robin_spreads_evenly(workload):
    out = run(workload, "round-robin")
    routed = [p["routed"] for p in out.fleet["per_instance"]]
    assert max(routed) - min(routed) <= 1 and sum(routed) == len(workload)


def shared_prefix_workload(groups: int = 10, per_group: int = 6) -> Workload:
    """Requests in groups sharing an 8-block (4096-token) prefix, then one block of their own."""
    n = groups * per_group
    group = np.arange(n) % groups
    blocks = [np.concatenate([1000 * (g + 1) + np.arange(8), [100000 + i]]) for i, g in enumerate(group)]
    return Workload(name="groups", source="test", arrival_s=np.arange(n) * 0.5, input_len=np.full(n, 9 * 512 - 100),
                    output_len=np.full(n, 8), priority=np.zeros(n), block_offsets=np.arange(n + 1) * 9,
                    block_ids=np.concatenate(blocks))


def test_cache_aware_hits_more_prefix_than_round_robin():
    workload = shared_prefix_workload()
    rr = summarize(run(workload, "round-robin").result)
    ca_run = run(workload, "route-cache-aware")
    ca = summarize(ca_run.result)
    assert ca["prefix_hit_rate"] > rr["prefix_hit_rate"] + 0.1  # 0.76 (every hit possible) against 0.61
    assert ca_run.fleet["why"].get("cache", 0) >= 40  # (round robin sends a group to every instance)
    # each group's requests all went to one instance
    group = np.arange(len(workload)) % 10
    assert all(np.unique(ca_run.instance_of[group == g]).size == 1 for g in range(10))


def test_removing_an_instance_reroutes_its_requests(workload):
    removal = Removal(at_s=4.0, instance=1)
    out = run(workload, "least-load", removals=[removal])
    assert out.fleet["rerouted"] > 0
    assert_conserved(out, len(workload))
    assert not out.fleet["per_instance"][1]["alive"]
    # nothing finished on the removed instance after it went
    r = out.result.requests
    late = (out.instance_of == 1) & (r.finish_s > removal.at_s)
    assert not late.any()


def test_chain_hashes_name_the_whole_prefix():
    ids = np.array([1, 2, 3, 1, 2, 4, 9, 2], dtype=np.int64)
    offsets = np.array([0, 3, 6, 8], dtype=np.int64)
    h = chain_hashes(ids, offsets)
    assert h[0] == h[3] and h[1] == h[4] and h[2] != h[5]
    assert h[7] != h[1]  # block 2 after 9 is another prefix than block 2 after 1
    assert (h > 0).all()


def test_bad_fleet_options_are_located_errors(capsys, tmp_path):
    cases = [
        (["--instances", "0"], "--instances must be >= 1"),
        (["--instances", "2", "--router", "nope"], "--router 'nope'"),
        (["--instances", "2", "--router", "order-fcfs"], "a router is a router preset"),
        (["--instances", "2", "--remove-instance", "5@1"], "the fleet has instances 0..1"),
        (["--instances", "2", "--remove-instance", "x"], "expected INSTANCE@SECONDS"),
    ]
    for argv, message in cases:
        code = main(["sim", "--workload", "conversation", "--num-requests", "5", "--quiet", *argv])
        err = capsys.readouterr().err
        assert code == EXIT_BAD_INPUT, argv
        assert message in err and "Traceback" not in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n{"timestamp": "x"}\n')
    code = main(["sim", "--trace", str(bad), "--instances", "2", "--quiet"])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT and "bad.jsonl:2" in err


def test_cli_sim_and_bench_print_the_fleet(capsys, tmp_path):
    out_json = tmp_path / "fleet.json"
    code = main(["sim", "--workload", "conversation", "--num-requests", "20", "--instances", "2", "--router",
                 "mooncake", "--quiet", "--num-blocks", "4000", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert code == EXIT_OK
    assert "goodput" in out and "per-instance load" in out
    m = json.loads(out_json.read_text())
    assert m["fleet"]["instances"] == 2 and m["requests"]["finished"] + m["requests"]["rejected"] == 20
    code = main(["bench", "--workload", "conversation", "--num-requests", "20", "--instances", "2", "--routers",
                 "round-robin,least-load", "--quiet", "--num-blocks", "4000", "--plots", str(tmp_path / "plots")])
    out = capsys.readouterr().out
    assert code == EXIT_OK and "round-robin" in out and "least-load" in out and "prefix-hit rate" in out
    for name in ("round-robin-load.png", "round-robin-routing.png", "least-load-load.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 0


def test_parse_removal():
    assert parse_removal("3@120") == Removal(120.0, 3)
    with pytest.raises(ValueError, match="INSTANCE@SECONDS"):
        parse_removal("3")


def test_pd_disaggregation_moves_requests_to_decode_instances_with_their_kv(workload):
    fleet = FleetConfig(instances=3, router="mooncake-pd", prefill_instances=1)
    roomy = SimConfig(num_blocks=40000)  # room for every prompt's KV on the decode instances
    out = FleetSimulator(roomy, fleet).run(workload.head(30))
    assert_conserved(out, 30)
    r = out.result.requests
    finished = ~np.isnan(r.finish_s)
    assert (out.instance_of[finished & (r.output_len > 1)] >= 1).all()  # ended on a decode instance
    assert out.fleet["transfers"] >= finished.sum()
    # the decode instances received the prompts' KV: the fleet computed each prompt once (less
    # its prefix hits), plus a partial block and a token per request on the decode side
    assert out.result.steps.column("prefill_tokens").sum() <= r.input_len[finished].sum() + 17 * finished.sum()


def test_pd_needs_a_disaggregating_router():
    with pytest.raises(ValueError, match="needs pd-disaggregate"):
        FleetSimulator(ENGINE, FleetConfig(instances=3, router="mooncake", prefill_instances=1))


def hot_prefix_workload() -> Workload:
    """Nine requests share an 8-block prefix and keep instance 0 busy (long outputs), then two
    more with it arrive together: instance 0 is overloaded, so the router replicates the prefix."""
    n = 11
    blocks = [np.concatenate([1000 + np.arange(8), [100000 + i]]) for i in range(n)]
    arrival = np.concatenate([np.arange(9) * 0.01, [0.2, 0.2]])
    return Workload(name="hot", source="test", arrival_s=arrival, input_len=np.full(n, 9 * 512 - 100),
                    output_len=np.full(n, 400), priority=np.zeros(n), block_offsets=np.arange(n + 1) * 9,
                    block_ids=np.concatenate(blocks))


def test_replicated_prefix_is_copied_into_the_target_pool():
    from schedir.sim.fleet_instances import LocalInstances

    workload = hot_prefix_workload()
    router = "replicate-hot-prefix,route-cache-aware"
    made = []

    def backend(*args):
        made.append(LocalInstances(*args))
        return made[-1]

    runs = {copy: FleetSimulator(ENGINE, FleetConfig(instances=2, router=router, copy_kv=copy), backend).run(workload)
            for copy in (True, False)}
    copied, counted = runs[True], runs[False]
    for out in runs.values():
        assert out.fleet["replicas"] == 1 and out.instance_of[9] == out.instance_of[10] == 1  # routed onto the replica
        assert_conserved(out, len(workload))
    hits = copied.result.requests.prefix_hit_tokens
    assert copied.fleet["copied_blocks"] == 8 * 512 // ENGINE.block_size and not copied.fleet["copy_skipped"]
    assert (hits[9:] >= 8 * 512).all()  # both found the copied prefix on instance 1
    assert counted.result.requests.prefix_hit_tokens[9] == 0  # without the copy the first one recomputes it
    assert counted.fleet["copied_blocks"] == 0
    for instances in made:  # blocks conserved, cache map consistent, every block free again
        for core in instances.cores:
            pool = core.engine.sched.pool
            pool.check()
            assert pool.num_free == pool.usable_blocks


def test_prefix_copy_between_instances_fits_migrates_or_is_skipped():
    """The instances' copy primitive: a migrate leaves the source's cache; a target without room
    takes nothing; a source still using the prefix keeps it; every pool stays consistent."""
    from schedir.sim.engine import engine_sizes
    from schedir.sim.fleet_instances import LocalInstances
    from schedir.sim.records import RequestLog, StepLog

    blocks_of = [np.concatenate([base + np.arange(8), [base + 99]]) for base in (1000, 2000)]  # prefixes A, B
    workload = Workload(name="two", source="test", arrival_s=np.zeros(2), input_len=np.full(2, 9 * 512 - 100),
                        output_len=np.array([1, 50]), priority=np.zeros(2), block_offsets=np.array([0, 9, 18]),
                        block_ids=np.concatenate(blocks_of))
    config = SimConfig(num_blocks=300)  # one 4.5k-token request holds 283 of the 299 blocks
    reqs = RequestLog(workload.arrival_s, workload.input_len, workload.output_len)
    fleet = LocalInstances(config, reqs, [StepLog(64) for _ in range(3)], engine_sizes(config), workload)
    one = np.array([1], dtype=np.int64)
    fleet.add({0: (np.array([0]), one)}, 0.0)  # request 0 runs on instance 0 and finishes: its prefix stays cached
    fleet.advance([0], 10.0)
    fleet.add({1: (np.array([1]), np.array([50]))}, 0.0)  # request 1 prefills on instance 1 and keeps decoding
    fleet.advance([1], 10.0, 1)
    prefix, other = workload.block_ids[:8], workload.block_ids[9:17]
    blocks = 8 * 512 // config.block_size
    assert fleet.copy_prefix(0, 1, prefix, migrate=False).why == "no_room"  # 16 free blocks on instance 1
    assert fleet.cores[1].cached_prefix(prefix) == 0 and fleet.cores[1].cached_prefix(other) == blocks
    moved = fleet.copy_prefix(0, 2, prefix, migrate=True)
    assert (moved.blocks, moved.dropped, moved.why) == (blocks, blocks, "")
    assert fleet.cores[2].cached_prefix(prefix) == blocks and fleet.cores[0].cached_prefix(prefix) == 0
    kept = fleet.copy_prefix(1, 0, other, migrate=True)  # request 1 still uses it on instance 1
    assert (kept.blocks, kept.dropped) == (blocks, 0) and fleet.cores[1].cached_prefix(other) == blocks
    assert fleet.cores[0].cached_prefix(other) == blocks
    assert fleet.copy_prefix(0, 2, np.array([5, 6]), migrate=False).why == "source_evicted"
    for core in fleet.cores:
        core.engine.sched.pool.check()


def test_kv_pool_adopt_cached_keeps_the_pool_whole():
    from schedir.lowering.kv_pool import KVPool

    pool = KVPool.create(10, 16, 8)
    assert pool.adopt_cached(np.array([5, 6, 7])) == 3
    assert (pool.num_free, pool.num_cached_free()) == (9, 3)
    assert pool.adopt_cached(np.array([5, 6, 7, 8, 9, 10, 11, 12])) == 5  # 5, 6, 7 already there
    before = pool.copy()
    assert pool.adopt_cached(np.arange(5, 15)) == -1  # 2 missing, 1 free block outside the chain: nothing changes
    np.testing.assert_array_equal(pool.nxt, before.nxt)
    np.testing.assert_array_equal(pool.cache, before.cache)
    assert pool.adopt_cached(np.array([20, 21])) == 2  # the last uncached free block, then hash 5's (LRU)
    _, hashes = pool.cached_blocks()
    assert 5 not in hashes.tolist() and {6, 12, 20, 21} <= set(hashes.tolist())
    pool.check()


def read_csv(path):
    import csv

    with path.open() as f:
        return list(csv.DictReader(f))


def test_fleet_plots_hold_the_load_and_the_routing_timeline(tmp_path):
    from schedir.sim.fleet_plots import write_fleet_plots

    workload = hot_prefix_workload()
    out = run(workload, "replicate-hot-prefix,route-cache-aware", instances=2)
    m = summarize(out.result)
    m["fleet"] = out.fleet
    paths = write_fleet_plots(m, tmp_path)
    assert sorted(p.name for p in paths) == sorted(f"{m['config']}-{kind}.{ext}".replace(",", "_")
                                                   for kind in ("load", "routing") for ext in ("png", "csv"))
    assert all(p.stat().st_size > 0 for p in paths)
    load = read_csv(next(p for p in paths if p.name.endswith("load.csv")))
    busy = [row for row in load if row["instance"] == "0"]
    assert max(float(row["running"]) for row in busy) >= 9 and max(float(row["kv"]) for row in busy) > 0.05
    assert {row["instance"] for row in load} == {"0", "1"}
    events = read_csv(next(p for p in paths if p.name.endswith("routing.csv")))
    routes = [row for row in events if row["event"] == "route"]
    assert [int(row["dst"]) for row in routes] == out.instance_of.tolist()
    (copy,) = [row for row in events if row["event"] == "replicate"]
    assert (copy["src"], copy["dst"], copy["detail"]) == ("0", "1", "256 blocks")
    assert float(copy["landed_s"]) > float(copy["t_s"]) == 0.2  # decided at the batch's arrival, landed later


def test_fleet_routing_timeline_shows_rejections_and_transfers(tmp_path):
    from schedir.sim.fleet_plots import write_fleet_plots

    n = 6
    input_len = np.full(n, 1000)
    input_len[3] = 20000  # longer than the model's context: rejected
    offsets = np.concatenate([[0], np.cumsum(-(-input_len // 512))])
    workload = Workload(name="pd", source="test", arrival_s=np.arange(n) * 0.1, input_len=input_len,
                        output_len=np.full(n, 4), priority=np.zeros(n), block_offsets=offsets,
                        block_ids=np.arange(offsets[-1]))
    fleet = FleetConfig(instances=3, router="mooncake-pd", prefill_instances=1)
    out = FleetSimulator(SimConfig(num_blocks=4000, max_model_len=8192), fleet).run(workload)
    m = summarize(out.result)
    m["fleet"] = out.fleet
    write_fleet_plots(m, tmp_path)
    events = read_csv(tmp_path / "mooncake-pd-routing.csv")
    (reject,) = [row for row in events if row["event"] == "reject"]
    assert reject["request"] == "3" and reject["detail"]
    transfers = [row for row in events if row["event"] == "transfer"]
    assert len(transfers) == n - 1 and all(row["src"] == "0" and row["dst"] in ("1", "2") for row in transfers)


class FreshRouteSteps:
    """A new route step IR per arrival batch (what the fleet built before it recycled one)."""

    def build(self, *args):
        from schedir.ir.route_step import build_route_step

        return build_route_step(*args)


@pytest.mark.parametrize("router", ["mooncake", "sglang-router", "mooncake-pd"])
@pytest.mark.parametrize("builder", ["recycled", "fresh", "passes"])
def test_routing_over_arrays_decides_as_the_ir(workload, router, builder, monkeypatch):
    """The fleet routes by the router's lowered program (one kernel a step); pass by pass over
    arrays, or over a recycled or a fresh step IR instead, every request goes where it went, with
    the same results, replicas and copies."""
    from schedir.ir.route_step import RecycledRouteStep

    kw = {"prefill_instances": 1} if router == "mooncake-pd" else {}
    recycled = run(workload, router, **kw)  # lowered (the name from when the IR was recycled)
    if builder == "passes":
        monkeypatch.setattr(FleetSimulator, "lowered", False)
    else:
        monkeypatch.setattr(FleetSimulator, "route_steps",
                            RecycledRouteStep if builder == "recycled" else FreshRouteSteps)
    fresh = run(workload, router, **kw)
    np.testing.assert_array_equal(recycled.instance_of, fresh.instance_of)
    a, b = summarize(recycled.result), summarize(fresh.result)
    for m in (a, b):
        for key in ("sim_wall_s", "scheduler_us_per_step", "scheduler_us", "scheduler_share_of_gpu_time"):
            m.pop(key, None)
    assert a == b
    for key in ("why", "replicas", "copied_blocks", "per_instance"):
        assert recycled.fleet[key] == fresh.fleet[key]


@pytest.mark.parametrize("kill", [False, True])
def test_requests_waiting_for_a_copy_survive_the_target_leaving(kill):
    """Instance 1 leaves while the prefix is on the link to it: the two requests routed onto the
    replica are routed again (none lost, none twice) and the copy is skipped, its reason kept;
    routed again, they make the router replicate the prefix to instance 2."""
    workload = hot_prefix_workload()
    fleet = FleetConfig(instances=3, router="replicate-hot-prefix,route-cache-aware",
                        removals=(Removal(at_s=0.201, instance=1, kill=kill),))
    out = FleetSimulator(ENGINE, fleet).run(workload)
    assert out.fleet["replicas"] == 2 and out.fleet["copy_skipped"] == {"target_lost": 1}
    assert out.fleet["copied_blocks"] == 256 and out.fleet["rerouted"] == 2
    assert out.instance_of[9:].tolist() == [2, 2] and (out.result.requests.prefix_hit_tokens[9:] >= 4096).all()
    assert_conserved(out, len(workload))


def test_routing_steps_dump_after_every_pass_and_replay(workload, tmp_path, capsys):
    """`schedir sim --instances N --dump-steps ... --dump-dir D` writes the listed routing steps'
    IR after every pass; `schedir opt` on a dumped input gives the dumped result; the fleet decides
    as it does without dumps (the dumped steps run over the IR, the others over arrays)."""
    from schedir.ir.textio import parse_step_text, print_ir

    plain = run(workload, "mooncake")
    dumped = FleetSimulator(ENGINE, FleetConfig(instances=4, router="mooncake", dump_steps=(1, 2, 5),
                                                dump_dir=tmp_path)).run(workload)
    np.testing.assert_array_equal(plain.instance_of, dumped.instance_of)
    assert plain.fleet["why"] == dumped.fleet["why"]
    passes = ("00-input", "01-slo-early-reject", "02-replicate-hot-prefix", "03-route-cache-aware",
              "04-topology-distance")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"route-step-{n:05d}-{p}.mlir" for n in (1, 2, 5) for p in passes)
    final = (tmp_path / "route-step-00005-04-topology-distance.mlir").read_text()
    assert "cluster.route_step 5 " in final and "cluster.route %" in final
    code = main(["opt", str(tmp_path / "route-step-00005-00-input.mlir"), "-p", "mooncake"])
    out = capsys.readouterr().out
    assert code == EXIT_OK
    assert print_ir(parse_step_text(out)) == print_ir(parse_step_text(final))


def test_routing_dumps_need_a_folder(capsys):
    code = main(["sim", "--workload", "conversation", "--num-requests", "5", "--instances", "2", "--quiet",
                 "--dump-steps", "1"])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT
    assert "--dump-steps needs --dump-dir" in err and err.count("\n") == 1
