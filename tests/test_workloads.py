"""Workloads: trace loaders and their bad-row reports, prompt tokens, the synthetic generator, real traces."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import numpy as np
import pytest

from schedir.sim.workloads import (
    BUILTIN_WORKLOADS,
    BadRow,
    SyntheticSpec,
    TraceError,
    Workload,
    builtin_workload,
    detect_format,
    generate,
    load_azure,
    load_mooncake,
    load_sharegpt,
    load_trace,
    load_vidur_trace,
)

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"


def _jsonl(tmp_path: Path, rows: list[object], name: str = "trace.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _csv(tmp_path: Path, lines: list[str], name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _row(ts: float = 250, n_in: int = 600, n_out: int = 5, ids: list[int] | None = None) -> dict[str, object]:
    return {"timestamp": ts, "input_length": n_in, "output_length": n_out,
            "hash_ids": ids if ids is not None else list(range(-(-n_in // 512)))}


# ---- Mooncake ----

def test_mooncake_good_rows(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, [_row(1000, 1024, 3, [0, 1]), _row(1500, 1100, 7, [0, 1, 2]), "", _row(4000, 10, 1, [9])])
    w = load_mooncake(path)
    assert len(w) == 3 and w.skipped == ()
    assert w.arrival_s.tolist() == [0.0, 0.5, 3.0]
    assert w.input_len.tolist() == [1024, 1100, 10] and w.output_len.tolist() == [3, 7, 1]
    assert w.blocks(1).tolist() == [0, 1, 2] and w.priority.tolist() == [0, 0, 0]
    assert w.prefix_hit_tokens().tolist() == [0, 1024, 0]
    assert load_mooncake(path, limit=2).input_len.tolist() == [1024, 1100]


@pytest.mark.parametrize("bad, reason", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    (json.dumps({"timestamp": 5, "input_length": 10, "hash_ids": [1]}), "missing field(s) output_length"),
    (_row(n_out=-3), "output_length must be a positive integer, got -3"),
    (_row(n_in=0, ids=[]), "input_length must be a positive integer, got 0"),
    (_row(n_in=12.5, ids=[1]), "input_length must be a positive integer, got 12.5"),
    (_row(n_out=True), "output_length must be a positive integer, got True"),
    (_row(ts=-1), "timestamp must be a finite number >= 0, got -1"),
    (_row(ts="soon"), "timestamp must be a number, got 'soon'"),
    (_row(ts=100), "timestamp 100 is earlier than the previous row's 200"),
    (_row(n_in=1100, ids=[0, 1]), "hash_ids has 2 ids, but input_length 1100 needs ceil(1100/512) = 3"),
    (_row(n_in=10, ids=[-4]), "hash_ids must hold integers in [0, 2**63), got -4"),
    (_row(n_in=10, ids=7), "hash_ids must be a list of block ids, got int"),
])
def test_mooncake_bad_row(tmp_path: Path, bad: object, reason: str) -> None:
    path = _jsonl(tmp_path, [_row(0), _row(200), bad, _row(300)],
                  name="conversation_trace.jsonl")
    with pytest.raises(TraceError) as info:
        load_mooncake(path)
    assert info.value.line == 3 and info.value.path == str(path)
    assert str(info.value).startswith(f"conversation_trace.jsonl:3: {reason}")

    w = load_mooncake(path, on_bad_row="skip")
    assert len(w) == 3 and w.arrival_s.tolist() == [0.0, 0.2, 0.3]
    assert len(w.skipped) == 1 and isinstance(w.skipped[0], BadRow)
    assert w.skipped[0].line == 3 and w.skipped[0].reason.startswith(reason)


def test_mooncake_error_message_example(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, [_row(i) for i in range(16)] + [_row(16, n_out=-3)], name="conversation_trace.jsonl")
    with pytest.raises(TraceError, match=r"^conversation_trace\.jsonl:17: output_length must be a positive "
                                         r"integer, got -3$"):
        load_mooncake(path)


def test_empty_files_and_policy(tmp_path: Path) -> None:
    empty = _jsonl(tmp_path, [])
    with pytest.raises(TraceError, match="empty file"):
        load_mooncake(empty)
    all_bad = _jsonl(tmp_path, [_row(n_out=0)], name="bad.jsonl")
    with pytest.raises(TraceError, match=r"no usable requests \(1 bad rows skipped\)"):
        load_mooncake(all_bad, on_bad_row="skip")
    with pytest.raises(ValueError, match="on_bad_row must be one of"):
        load_mooncake(empty, on_bad_row="ignore")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(TraceError, match=r"empty\.csv:1: empty file"):
        load_azure(tmp_path / "empty.csv")
    with pytest.raises(TraceError, match=r"header\.csv:2: no usable requests"):
        load_azure(_csv(tmp_path, [AZURE_HEADER], name="header.csv"))


# ---- CSV formats ----

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def test_azure_good_rows(tmp_path: Path) -> None:
    path = _csv(tmp_path, [AZURE_HEADER, "2023-11-16 23:59:59.5000000,374,44",
                           "2023-11-17 00:00:00.7500000,396,109", "2023-11-17 00:00:00.7500000,1,1"])
    w = load_azure(path)
    assert np.allclose(w.arrival_s, [0.0, 1.25, 1.25])
    assert w.input_len.tolist() == [374, 396, 1] and w.output_len.tolist() == [44, 109, 1]
    assert len(np.unique(w.block_ids)) == len(w.block_ids)  # no content in the trace: nothing is shared
    assert w.stats()["prefix_hit_token_fraction"] == 0.0


@pytest.mark.parametrize("bad, reason", [
    ("2023-11-16 18:17:03.9799600,0,5", "ContextTokens must be a positive integer, got '0'"),
    ("2023-11-16 18:17:03.9799600,12.5,5", "ContextTokens must be a positive integer, got '12.5'"),
    ("2023-11-16 18:17:03.9799600,10,", "GeneratedTokens must be a positive integer, got ''"),
    ("2023-11-16 18:17:03.9799600,10", "expected 3 fields, got 2"),
    ("16/11/2023 18:17:03,10,5", "TIMESTAMP must look like 2023-11-16 18:17:03.9799600, got '16/11/2023 18:17:03'"),
    ("2023-11-16 25:17:03.0,10,5", "TIMESTAMP must look like"),
    ("2023-11-16 18:17:02.0,10,5", "TIMESTAMP 2023-11-16 18:17:02.0 is earlier than the previous row's 2023-11-16 18:17:03.0"),
])
def test_azure_bad_row(tmp_path: Path, bad: str, reason: str) -> None:
    path = _csv(tmp_path, [AZURE_HEADER, "2023-11-16 18:17:03.0,1,1", bad, "2023-11-16 18:17:04.0,2,2"])
    with pytest.raises(TraceError) as info:
        load_azure(path)
    assert info.value.line == 3 and reason in str(info.value)
    w = load_azure(path, on_bad_row="skip")
    assert w.input_len.tolist() == [1, 2] and [b.line for b in w.skipped] == [3]


def test_csv_wrong_header_refuses_the_file(tmp_path: Path) -> None:
    path = _csv(tmp_path, ["time,prompt,output", "1,2,3"])
    for loader in (load_azure, load_vidur_trace, lambda p, **kw: load_sharegpt(p, rate=1.0, **kw)):
        with pytest.raises(TraceError, match=r"trace\.csv:1: wrong header: expected columns") as info:
            loader(path, on_bad_row="skip")
        assert info.value.line == 1
    with pytest.raises(TraceError, match="TIMESTAMP,ContextTokens,GeneratedTokens"):
        load_azure(path)
    with pytest.raises(TraceError, match="unknown trace header"):
        detect_format(path)


def test_vidur_trace(tmp_path: Path) -> None:
    path = _csv(tmp_path, ["request_id,arrived_at,num_prefill_tokens,num_decode_tokens",
                           "a,0.5,100,10", "b,1.0,200.0,20", "c,0.9,300,30", "d,2.0,-1,5", "e,3.0,400,40"])
    with pytest.raises(TraceError, match=r"trace\.csv:4: arrived_at 0.9 is earlier than the previous row's 1"):
        load_vidur_trace(path)
    w = load_vidur_trace(path, on_bad_row="skip")
    assert w.arrival_s.tolist() == [0.0, 0.5, 2.5] and w.input_len.tolist() == [100, 200, 400]
    assert [(b.line, b.reason.split(" ")[0]) for b in w.skipped] == [(4, "arrived_at"), (5, "num_prefill_tokens")]
    assert detect_format(path) == "vidur"


def test_sharegpt_lengths_get_poisson_arrivals(tmp_path: Path) -> None:
    lines = ["num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio"]
    lines += [f"{10 + i},{5 + i},{15 + 2 * i},0.5" for i in range(2000)]
    lines[3] = "12,7,99,0.5"
    path = _csv(tmp_path, lines)
    with pytest.raises(TraceError, match=r"trace\.csv:4: num_total_tokens 99 != num_prefill_tokens 12"):
        load_sharegpt(path, rate=4.0)
    w = load_sharegpt(path, rate=4.0, seed=1, on_bad_row="skip")
    assert len(w) == 1999 and w.skipped[0].line == 4
    gaps = np.diff(w.arrival_s)
    assert abs(gaps.mean() - 0.25) < 0.03 and abs(gaps.std() / gaps.mean() - 1.0) < 0.1  # exponential gaps
    assert np.array_equal(load_sharegpt(path, rate=4.0, seed=1, on_bad_row="skip").arrival_s, w.arrival_s)
    with pytest.raises(ValueError, match="rate must be a positive"):
        load_sharegpt(path, rate=0.0)
    with pytest.raises(ValueError, match="pass rate="):
        load_trace(path)
    assert len(load_trace(path, rate=2.0, on_bad_row="skip")) == 1999


def test_load_trace_picks_the_loader(tmp_path: Path) -> None:
    moon = _jsonl(tmp_path, [_row(0), _row(1000)])
    azure = _csv(tmp_path, [AZURE_HEADER, "2023-11-16 18:17:03.0,1,1", "2023-11-16 18:17:05.0,2,2"], name="az.csv")
    assert detect_format(moon) == "mooncake" and detect_format(azure) == "azure"
    assert load_trace(moon).arrival_s.tolist() == [0.0, 1.0]
    assert load_trace(azure, rate=2.0).arrival_s.tolist() == [0.0, 1.0]  # 2 requests over 1 s
    assert load_trace(azure, format="azure").input_len.tolist() == [1, 2]
    with pytest.raises(ValueError, match="unknown trace format"):
        load_trace(azure, format="parquet")


# ---- the Workload record and its tokens ----

def _shared_prefix_workload() -> Workload:
    return Workload(name="t", source="test", arrival_s=[0.0, 1.0, 2.0], input_len=[1024, 1300, 700],
                    output_len=[1, 1, 1], priority=[0, 0, 0], block_offsets=[0, 2, 5, 7],
                    block_ids=[10, 11, 10, 11, 12, 10, 99])


def test_prompt_tokens_follow_block_ids() -> None:
    w = _shared_prefix_workload()
    a, b, c = (w.prompt_tokens(i) for i in range(3))
    assert a.dtype == np.int32 and [len(a), len(b), len(c)] == [1024, 1300, 700]
    assert np.array_equal(a, b[:1024])  # blocks 10, 11 shared
    assert np.array_equal(a[:512], c[:512]) and not np.array_equal(a[512:700], c[512:])
    assert np.array_equal(w.prompt_tokens(1), b)  # same call, same tokens
    assert np.array_equal(_shared_prefix_workload().prompt_tokens(1), b)
    small = w.prompt_tokens(1, vocab_size=100)
    assert small.min() >= 0 and small.max() < 100 and len(np.unique(small)) > 90
    assert b.min() >= 0 and b.max() < 32000
    # the value is pinned: a change to the hash would silently change every simulated prompt
    assert a[:4].tolist() == _shared_prefix_workload().prompt_tokens(0)[:4].tolist()


def test_prompt_tokens_are_stable_across_processes() -> None:
    import subprocess
    import sys
    code = ("from schedir.sim.workloads.tokens import block_tokens_of;"
            "print(block_tokens_of([5, 6], 600, 512, 32000)[[0, 1, 511, 512, 599]].tolist())")
    from schedir.sim.workloads.tokens import block_tokens_of
    here = block_tokens_of(np.array([5, 6]), 600, 512, 32000)[[0, 1, 511, 512, 599]].tolist()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1], env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert json.loads(out.stdout) == here


def test_workload_checks_and_helpers() -> None:
    w = _shared_prefix_workload()
    assert w.prefix_hit_tokens().tolist() == [0, 1024, 512]
    assert w.stats()["prefix_hit_token_fraction"] == pytest.approx(1536 / 3024)
    h = w.head(2)
    assert len(h) == 2 and h.block_ids.tolist() == [10, 11, 10, 11, 12]
    r = w.with_rate(3.0)
    assert r.arrival_s.tolist() == [0.0, 0.5, 1.0] and r.stats()["rate_req_s"] == pytest.approx(3.0)
    with pytest.raises(ValueError):
        w.arrival_s[0] = 1.0  # read-only columns
    with pytest.raises(ValueError, match="content blocks"):
        attrs.evolve(w, input_len=[1024, 1300, 1100])
    with pytest.raises(ValueError, match="non-decreasing"):
        attrs.evolve(w, arrival_s=[0.0, 2.0, 1.0])


# ---- synthetic ----

def test_conversation_defaults_match_mooncake() -> None:
    w = builtin_workload("conversation")
    s = w.stats()
    assert len(w) == 12_000 and s["rate_req_s"] == pytest.approx(3.4)
    for key, target in (("input_p50", 6909), ("input_p99", 85400), ("output_p50", 350)):
        assert abs(s[key] / target - 1) < 0.15, (key, s[key])
    assert abs(s["prefix_hit_token_fraction"] - 0.37) < 0.05
    assert np.all(w.input_len >= 891) and np.all(np.diff(w.arrival_s) >= 0)
    assert np.all(w.blocks(0)[:1] == 0) and all(w.blocks(i)[0] == 0 for i in range(0, 12_000, 997))


def test_generation_is_deterministic_per_seed() -> None:
    spec = SyntheticSpec(num_requests=500)
    a, b, c = generate(spec), generate(spec), generate(attrs.evolve(spec, seed=1))
    assert np.array_equal(a.block_ids, b.block_ids) and np.array_equal(a.arrival_s, b.arrival_s)
    assert not np.array_equal(a.input_len, c.input_len)


def test_multi_turn_shares_prefixes() -> None:
    spec = SyntheticSpec(num_requests=3000, system_prompt_tokens=0, continue_probs=(0.8,), continue_weights=(1.0,))
    w = generate(spec)
    hits = w.prefix_hit_tokens()
    assert np.mean(hits > 0) > 0.5 and hits.sum() / w.input_len.sum() > 0.5
    single = generate(attrs.evolve(spec, continue_probs=(0.0,)))
    assert single.prefix_hit_tokens().sum() == 0
    # block ids are chain-unique: an id always sits at the same position
    pos = np.arange(len(w.block_ids)) - np.repeat(w.block_offsets[:-1], np.diff(w.block_offsets))
    first = {}
    for b, p in zip(w.block_ids.tolist(), pos.tolist()):
        assert first.setdefault(b, p) == p
    # a hit is a real token prefix
    i = int(np.argmax(hits))
    j = next(k for k in range(i) if w.blocks(k)[0] == w.blocks(i)[0])
    shared = min(len(w.prompt_tokens(j)), hits[i])
    assert np.array_equal(w.prompt_tokens(i)[:shared], w.prompt_tokens(j)[:shared])


def test_system_prompts_are_shared_across_conversations() -> None:
    spec = SyntheticSpec(num_requests=400, system_prompt_tokens=1024, num_system_prompts=3,
                         continue_probs=(0.0,), continue_weights=(1.0,))
    w = generate(spec)
    heads = {tuple(w.blocks(i)[:2].tolist()) for i in range(len(w))}
    assert heads == {(0, 1), (2, 3), (4, 5)}
    assert w.stats()["prefix_hit_token_fraction"] > 0


def test_priority_classes_and_bursty_arrivals() -> None:
    w = builtin_workload("bursty-priority", num_requests=4000)
    share = np.bincount(w.priority) / len(w)
    assert len(share) == 2 and abs(share[0] - 0.2) < 0.05
    poisson = generate(attrs.evolve(BUILTIN_WORKLOADS["bursty-priority"], arrival="poisson", num_requests=4000))
    cv = [np.std(np.diff(x.arrival_s)) / np.mean(np.diff(x.arrival_s)) for x in (w, poisson)]
    assert cv[0] > 2.0 and abs(cv[1] - 1.0) < 0.1


def test_builtins_and_spec_checks() -> None:
    assert {"conversation", "chat-short", "bursty-priority"} <= set(BUILTIN_WORKLOADS)
    for name in BUILTIN_WORKLOADS:
        w = builtin_workload(name, num_requests=50, rate=2.0, seed=3)
        assert len(w) == 50 and w.stats()["rate_req_s"] == pytest.approx(2.0) and w.name == name
    with pytest.raises(ValueError, match="conversation, chat-short, bursty-priority"):
        builtin_workload("nope")
    with pytest.raises(ValueError):
        SyntheticSpec(rate=0.0)
    with pytest.raises(ValueError):
        SyntheticSpec(arrival="uniform")
    with pytest.raises(ValueError):
        SyntheticSpec(continue_probs=(1.0,), continue_weights=(1.0,))
    assert len(generate(SyntheticSpec(num_requests=1))) == 1


# ---- the real traces (read from ../shared, never copied) ----

def _trace(rel: str) -> Path:
    path = TRACES / rel
    if not path.exists():
        pytest.skip(f"real trace {path} is absent (the traces are not shipped with the project)")
    return path


def test_real_mooncake_conversation() -> None:
    w = load_mooncake(_trace("mooncake/conversation_trace.jsonl"))
    s = w.stats()
    assert len(w) == 12_031 and w.skipped == ()
    assert s["rate_req_s"] == pytest.approx(3.4, abs=0.05)
    assert (s["input_p50"], s["output_p50"]) == (6909, 350)
    assert s["prefix_hit_token_fraction"] == pytest.approx(0.3736, abs=0.002)
    assert np.all(w.blocks(len(w) - 1)[:1] == 0)


def test_real_mooncake_synthetic_trace() -> None:
    w = load_trace(_trace("mooncake/synthetic_trace.jsonl"))
    assert len(w) == 3993 and w.stats()["input_p50"] == 11_587


def test_real_azure_and_sharegpt() -> None:
    conv = load_trace(_trace("azure2023/AzureLLMInferenceTrace_conv.csv"))
    assert len(conv) == 19_366 and conv.stats()["input_p50"] == 1020 and conv.duration_s > 3000
    assert len(load_azure(_trace("azure2023/AzureLLMInferenceTrace_code.csv"))) == 8819
    share = load_trace(_trace("sharegpt/sharegpt_val_10k_llama2.csv"), rate=5.0)
    assert len(share) == 10_000 and share.stats()["rate_req_s"] == pytest.approx(5.0, rel=0.1)
