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


def run(workload, router: str, instances: int = 4, removals=()):
    fleet = FleetConfig(instances=instances, router=router, removals=tuple(removals))
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
