"""Run vLLM's own scheduler tests against another `SchedulerInterface` class and tally the outcome.

vLLM's unit tests for its v1 scheduler (`tests/v1/core/test_scheduler.py` and
`test_async_scheduler.py`) are the most detailed statement of what a vLLM scheduler must do,
but they ship only in vLLM's source distribution, not in the wheel. This tool fetches that
file from the package registry at run time (nothing of vLLM's is copied into this repository),
keeps the few test files it needs in a cache, writes the offline Hugging Face cache entry the
tests' model id needs, and runs pytest in a subprocess with `plugin.py`, which rebinds the test
modules' `Scheduler` / `AsyncScheduler` names to the classes under test. Every failure gets a
reason category derived from the failure itself (`classify.py`), so a tally separates real
adapter bugs ("interface/views behaviour") from tests that reach into vLLM's internals.

    python -m schedir.tools.vllm_tests                      # schedir's adapter
    python -m schedir.tools.vllm_tests --scheduler stock    # vLLM's own classes
    python -m schedir.tools.vllm_tests --compare            # both, side by side
"""

VLLM_VERSION = "0.32.0"
"""The vLLM release whose tests are run: the one schedir's adapter implements."""

TEST_FILES = ("tests/v1/core/test_scheduler.py", "tests/v1/core/test_async_scheduler.py")
"""The test modules that are run (paths inside the source distribution)."""
