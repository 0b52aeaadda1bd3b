"""`schedir sim`, `schedir bench`, `schedir stats`: outputs, files, and bad input as one clear message."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from schedir.tools.cli import EXIT_BAD_INPUT, EXIT_OK, main

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
REQUIRED_KEYS = ("ttft_s", "tbt_s", "e2e_s", "throughput_req_s", "throughput_tok_s", "prefix_hit_rate",
                 "batch_efficiency", "kv_utilization", "preemptions", "scheduler_us_per_step", "sim_wall_s")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_sim_builtin_workload_writes_json_and_plots(capsys, tmp_path):
    out_json = tmp_path / "run.json"
    code, out, err = run(capsys, "sim", "--workload", "conversation", "--num-requests", "30", "--quiet",
                         "--json", str(out_json), "--plots", str(tmp_path / "plots"),
                         "--requests-csv", str(tmp_path / "requests.csv"))
    assert code == EXIT_OK, err
    assert "TTFT p50" in out and "throughput" in out
    m = json.loads(out_json.read_text())
    for key in REQUIRED_KEYS:
        assert key in m
    assert m["requests"]["finished"] == 30
    assert {"p50", "p90", "p99"} <= set(m["ttft_s"])
    assert (tmp_path / "plots" / "latency_cdf.png").stat().st_size > 0
    assert (tmp_path / "plots" / "batch_composition.png").stat().st_size > 0
    with (tmp_path / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 30 and set(rows[0]) >= {"ttft_s", "e2e_s", "queueing_s", "mean_tbt_s", "preemptions"}
    ttft = sorted(float(r["ttft_s"]) for r in rows)
    assert ttft[len(ttft) // 2] == pytest.approx(m["ttft_s"]["p50"], rel=0.2)
    assert all(float(r["ttft_s"]) <= float(r["e2e_s"]) for r in rows)

    code, out, err = run(capsys, "stats", str(out_json), "--plots", str(tmp_path / "again"))
    assert code == EXIT_OK, err
    assert "TTFT p50" in out and (tmp_path / "again" / "latency_cdf.png").exists()


def test_bench_compares_engine_presets_as_written(capsys, tmp_path):
    """`schedir bench --configs vllm,vllm-v0,fastserve` runs as written (issue 15's one command):
    vllm-v0, whose engine's prefix caching is not reproduced, runs with it off, and the run's
    record says so."""
    code, out, err = run(capsys, "bench", "--configs", "vllm,vllm-v0,fastserve", "--num-requests", "20", "--quiet",
                         "--json", str(tmp_path / "bench.json"), "--plots", str(tmp_path / "p"))
    assert code == EXIT_OK, err
    runs = json.loads((tmp_path / "bench.json").read_text())["runs"]
    assert [r["config"] for r in runs] == ["vllm", "vllm-v0", "fastserve"]
    assert [r["settings"]["enable_prefix_caching"] for r in runs] == [True, False, True]


def test_bench_prints_configs_side_by_side_with_ratios(capsys, tmp_path):
    code, out, err = run(capsys, "bench", "--configs", "vllm,vllm@enable_prefix_caching=false", "--num-requests",
                         "25", "--quiet", "--json", str(tmp_path / "bench.json"), "--plots", str(tmp_path / "p"))
    assert code == EXIT_OK, err
    assert "vllm@enable_prefix_caching=false (x first)" in out
    assert "x)" in out  # ratio cells
    runs = json.loads((tmp_path / "bench.json").read_text())["runs"]
    assert [r["config"] for r in runs] == ["vllm", "vllm@enable_prefix_caching=false"]
    assert runs[0]["prefix_hit_rate"] > 0 and runs[1]["prefix_hit_rate"] == 0
    assert (tmp_path / "p" / "batch_composition.png").exists()
    code, out, _ = run(capsys, "stats", str(tmp_path / "bench.json"))
    assert code == EXIT_OK and "(x first)" in out


def test_sim_dumps_the_chosen_steps(capsys, tmp_path):
    code, _, err = run(capsys, "sim", "--num-requests", "3", "--quiet", "--dump-steps", "2,4-5",
                       "--dump-dir", str(tmp_path / "d"))
    assert code == EXIT_OK, err
    steps = {p.name[:10] for p in (tmp_path / "d").glob("*.mlir")}
    assert steps == {"step-00002", "step-00004", "step-00005"}


def test_sim_trace_file(capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    rows = [{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]},
            {"timestamp": 100, "input_length": 700, "output_length": 3, "hash_ids": [0, 2]}]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, _, err = run(capsys, "sim", "--trace", str(trace), "--quiet", "--json", str(tmp_path / "r.json"))
    assert code == EXIT_OK, err
    m = json.loads((tmp_path / "r.json").read_text())
    assert m["requests"]["finished"] == 2 and m["prefix_hit_rate"] > 0


@pytest.mark.parametrize("argv, message", [
    (["sim", "--model", "llama-9b", "--num-requests", "2"], "llama-3-8b"),
    (["sim", "--gpu", "tpu-v5", "--num-requests", "2"], "h100"),
    (["sim", "--workload", "nope"], "conversation"),
    (["sim", "--preset", "no-such-preset", "--num-requests", "2", "--quiet"], "no-such-preset"),
    (["sim", "--num-requests", "0"], "--num-requests must be positive"),
    (["sim", "--dump-steps", "3"], "--dump-steps needs --dump-dir"),
    (["sim", "--dump-steps", "x", "--dump-dir", "d"], "not a step number"),
    (["bench", "--configs", "vllm@colour=red"], "unknown field 'colour'"),
])
def test_bad_input_is_one_clear_message(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == EXIT_BAD_INPUT
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["sim", "--preset", "no-such-preset", "--num-requests", "2"], "no-such-preset"),
    (["sim", "--preset", "mlfq-order", "--num-requests", "2"], "reject-oversized"),  # the runtime refuses it
    (["bench", "--configs", "vllm,no-such-preset", "--num-requests", "2"], "no-such-preset"),
    (["bench", "--configs", "vllm,orca", "--num-requests", "2"], "orca@max_model_len=8192"),  # budget < model len
    (["sim", "--instances", "2", "--preset", "no-such-preset", "--num-requests", "2"], "no-such-preset"),
])
def test_a_refused_pipeline_is_said_before_any_progress(capsys, argv, message):
    """No progress bar, warm-up line or fleet banner ahead of the error (they printed first;
    Orca's token budget below the model's length was said only at its first step)."""
    code, out, err = run(capsys, *argv)
    assert code == EXIT_BAD_INPUT
    assert message in err and "Traceback" not in err
    assert out == ""


def test_bad_trace_row_names_file_and_line(capsys, tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
                     '{"timestamp": 5, "input_length": 600, "output_length": -3, "hash_ids": [0, 1]}\n'
                     '{"timestamp": 9, "input_length": 100, "output_length": 2, "hash_ids": [7]}\n')
    code, _, err = run(capsys, "sim", "--trace", str(trace), "--quiet")
    assert code == EXIT_BAD_INPUT
    assert "bad.jsonl:2" in err and "output_length" in err
    code, out, err = run(capsys, "sim", "--trace", str(trace), "--quiet", "--skip-bad-rows")
    assert code == EXIT_OK, err
    assert "bad.jsonl:2" in out and "skipped" in out


def test_stats_refuses_a_file_that_is_not_a_run(capsys, tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    code, _, err = run(capsys, "stats", str(bad))
    assert code == EXIT_BAD_INPUT and "not written by schedir" in err
    bad.write_text("{not json")
    code, _, err = run(capsys, "stats", str(bad))
    assert code == EXIT_BAD_INPUT and "x.json:1" in err


@pytest.mark.parametrize("name, path, count", [
    ("mooncake", SHARED / "mooncake" / "conversation_trace.jsonl", 300),
    ("azure", SHARED / "azure2023" / "AzureLLMInferenceTrace_conv.csv", 300),
])
def test_sim_replays_real_traces(capsys, tmp_path, name, path, count):
    if not path.exists():
        pytest.skip(f"{path} absent: the real traces live in ../shared/data, not in the project")
    out_json = tmp_path / f"{name}.json"
    code, _, err = run(capsys, "sim", "--trace", str(path), "--preset", "vllm", "--num-requests", str(count),
                       "--quiet", "--json", str(out_json))
    assert code == EXIT_OK, err
    m = json.loads(out_json.read_text())
    for key in REQUIRED_KEYS:
        assert key in m
    assert m["requests"]["finished"] + m["requests"]["rejected"] == count


def test_file_and_option_errors_speak_the_users_words(capsys, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    not_runs = tmp_path / "runs.json"
    not_runs.write_text('{"runs": 5}')
    foreign = tmp_path / "foreign.json"
    foreign.write_text('{"config": "x", "ttft_s": 1, "tbt_s": 1, "e2e_s": 1, "requests": 1, "settings": 1}')
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b'{"timestamp": 0}\n\xff\xfe')
    small = ["--workload", "chat-short", "--num-requests", "3", "--quiet"]
    cases = [
        (["sim", "--trace", str(binary), "--quiet"], f"schedir sim: error: {binary}:2: not UTF-8 text (byte 0xff)"),
        (["sim", *small, "--max-model-len", "0"], "schedir sim: error: --max-model-len must be positive, got 0"),
        (["bench", *small, "--gpu-memory-utilization", "2"],
         "schedir bench: error: --gpu-memory-utilization must lie in (0, 1], got 2.0"),
        (["sim", *small, "--num-blocks", "1"],
         "schedir sim: error: num_blocks=1: a KV cache needs at least 2 blocks (block 0 is reserved, as in vLLM)"),
        (["sim", *small, "--tp", "3"], "schedir sim: error: tp must be one of 1, 2, 4, 8, got 3"),
        (["sim", "--trace", str(tmp_path / "missing.jsonl"), "--quiet"],
         f"schedir: error: --trace {tmp_path / 'missing.jsonl'}: cannot read: no such file or folder"),
        (["sim", "--trace", str(tmp_path), "--quiet"], f"schedir: error: --trace {tmp_path}: cannot read: is a folder, not a file"),
        (["stats", str(tmp_path / "missing.json")], f"schedir: error: {tmp_path / 'missing.json'}: cannot read: no such file or folder"),
        (["stats", str(not_runs)], f"schedir stats: error: {not_runs}: 'runs' is not a list of runs"),
        (["stats", str(foreign)], f"schedir stats: error: {foreign}: not a run written by schedir sim/bench (field 'workload' missing)"),
        (["sim", *small, "--json", str(a_file / "x.json")],
         f"schedir: error: --json {a_file / 'x.json'}: cannot write: {a_file}: exists and is not a folder"),
        (["sim", *small, "--dump-steps", "1", "--dump-dir", str(a_file / "d")],
         f"schedir: error: --dump-dir {a_file / 'd'}: cannot write: a part of that path is a file, not a folder"),
        (["bench", *small, "--configs", "vllm@num_blocks=lots"],
         "schedir bench: error: config 'vllm@num_blocks=lots': num_blocks='lots': expected an integer, got 'lots'"),
        (["bench", *small, "--configs", "reject-oversized+order-fcfs+schedule-running+admit-greedy{chunk=maybe}"],
         "schedir: error: pass 'admit-greedy': bad option chunk=maybe: expected true or false (options: "),
        (["sim", *small, "--preset", "reject-oversized,order-vllm{queue=waitingx},vllm-schedule-running,vllm-admit"],
         ("schedir: error: step 1: pass 'order-vllm': option queue=waitingx names no queue of the step; "
          "did you mean 'waiting'? (its queues: running, waiting)")),
    ]
    for argv, expected in cases:
        code, _, err = run(capsys, *argv)
        assert code == EXIT_BAD_INPUT, (argv, err)
        assert err.startswith(expected) and len(err.splitlines()) == 1, (argv, err)
        for leak in ("Traceback", "[Errno", "<class ", "invalid literal", "given ("):
            assert leak not in err, (argv, err)


def test_sim_dump_without_graphviz_says_svgs_were_skipped(capsys, monkeypatch, tmp_path):
    import shutil

    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "dot" else real_which(name, *a, **k))
    code, out, err = run(capsys, "sim", "--num-requests", "2", "--quiet", "--dump-steps", "1", "--dump-dir", str(tmp_path / "d"))
    assert code == EXIT_OK, err
    assert list((tmp_path / "d").glob("*.dot")) and not list((tmp_path / "d").glob("*.svg"))
    assert out.count("but no SVGs: Graphviz's `dot` is not installed") == 1


def test_bench_warms_up_every_config_before_timing(capsys, monkeypatch, tmp_path):
    """The first simulation of a process pays Numba's compilation: bench runs a few requests
    through each config, untimed, before the timed runs, so the first column compares."""
    from schedir.sim.simulator import Simulator
    from schedir.tools import sim_commands

    calls: list[tuple[str, int, bool]] = []
    real_run = Simulator.run

    def recording_run(self, workload, progress=None, **kw):
        calls.append((self.config.name, len(workload), progress is not None))
        return real_run(self, workload, progress, **kw)

    monkeypatch.setattr(Simulator, "run", recording_run)
    code, out, err = run(capsys, "bench", "--configs", "vllm,vllm@enable_prefix_caching=false",
                         "--num-requests", "12", "--plots", str(tmp_path / "p"))
    assert code == EXIT_OK, err
    names = ["vllm", "vllm@enable_prefix_caching=false"]
    first_timed = next(i for i, call in enumerate(calls) if call[2])
    assert calls[first_timed:] == [(name, 12, True) for name in names]  # the timed runs, in order
    warm = calls[:first_timed]
    assert {name for name, _, _ in warm} == set(names)  # every config ran untimed first
    assert (names[0], sim_commands.WARMUP_REQUESTS, False) in warm
    assert "warming up" in out


def test_bench_warm_up_preempts(monkeypatch):
    """A step that preempts calls the lowering kernel with other argument types (a kernel compiles
    once per signature): the warm-up must preempt, or the timed run pays that compilation."""
    from schedir.sim.simulator import Simulator
    from schedir.tools import sim_commands
    from schedir.tools.cli import build_parser

    results = []
    real_run = Simulator.run
    monkeypatch.setattr(Simulator, "run", lambda self, w, *a, **k: results.append(real_run(self, w, *a, **k)) or results[-1])
    args = build_parser().parse_args(["bench", "--num-requests", "4"])
    configs = sim_commands.parse_configs("vllm", sim_commands.base_config(args, "vllm"))
    sim_commands.warm_up(configs, sim_commands.load_workload(args, None))
    assert any(r.runtime_metrics["preemptions"] > 0 for r in results)
