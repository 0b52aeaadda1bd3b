"""Where Numba caches schedir's kernels, and keeping that cache honest across edits.

Numba kernels use `cache=True`, so a process loads machine code compiled once per machine
instead of paying ~14 s of compilation at every start. Two things need care:

- **Where.** Numba writes beside the source, in each package folder's `__pycache__`. An installed
  package in a read-only site-packages has no such place: then the kernels go to a user cache
  folder, `$XDG_CACHE_HOME/schedir/numba` (`~/.cache/schedir/numba` without XDG_CACHE_HOME),
  by setting NUMBA_CACHE_DIR before Numba is imported. A NUMBA_CACHE_DIR the user set is
  always respected.
- **Staleness.** `cache=True` keys a compiled kernel on its own file only: when a kernel calls a
  kernel from another module (the pool primitives, say) and that module changes, the caller's
  cached machine code silently keeps the old callee. So before any kernel loads, hash the
  sources of every module with kernels; if they changed since the cache was written, drop
  schedir's cached kernels wherever they are cached (they recompile once).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent
KERNEL_MODULES = (  # every module with a Numba kernel (tests/test_kernel_cache.py checks the list is whole)
    "ir/route_step.py", "ir/step.py", "ir/window.py", "lowering/batch_plan.py", "lowering/hashing.py",
    "lowering/host_pool.py",
    "lowering/held_hits.py", "lowering/kv_pool.py", "lowering/radix_cache.py", "lowering/radix_pool.py", "lowering/rows.py",
    "lowering/route_driver.py", "lowering/route_program.py", "lowering/route_state.py",
    "lowering/steady_layout.py", "lowering/steady_program.py", "passes/pd_disaggregate.py",
    "passes/replicate_hot_prefix.py", "passes/route_cache_aware.py", "passes/route_cache_balance.py",
    "passes/route_least_load.py", "passes/route_round_robin.py", "passes/slo_early_reject.py",
    "passes/topology_distance.py",
    "passes/batching_efficiency.py", "passes/kernels.py", "passes/memory_aware_preemption.py",
    "passes/mlfq_account.py", "passes/mlfq_levels.py",
    "passes/mlfq_order.py", "passes/mlfq_swap_in.py",
    "passes/orca_admit.py", "passes/order_slo.py", "passes/order_v0_priority.py", "passes/prefix_cache_aware.py",
    "passes/route_kernels.py",
    "passes/sglang_admit.py", "passes/sglang_decode.py",
    "passes/sglang_order.py", "passes/v0_chunked_running.py",
    "passes/v0_kernels.py", "passes/v0_prefills.py", "passes/v0_priority_preemption.py", "passes/v0_running.py",
    "passes/verify_step.py",
    "passes/vllm_kernels.py",
    "passes/vtc_account.py", "passes/vtc_order.py", "passes/vtc_state.py", "runtime/kernels.py",
    "runtime/steady_kernel.py", "runtime/window.py", "runtime/table.py",
    "dialects/codes.py", "sim/cost_model.py", "sim/decode_run.py", "sim/fleet.py", "sim/records.py",
    "sim/workloads/prefix.py", "sim/workloads/tokens.py",
)


def user_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/schedir/numba`, or `~/.cache/schedir/numba`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "schedir" / "numba"


def _writable(folder: Path) -> bool:
    """Whether Numba could write its cache into `folder` (created if missing)."""
    probe = folder if folder.exists() else folder.parent
    return os.access(probe, os.W_OK)  # False for a read-only mount too, even for root


def choose_cache_dir() -> Path | None:
    """The folder NUMBA_CACHE_DIR names for this process (set here when the package's own
    `__pycache__` folders are not writable), or None: Numba caches beside the sources."""
    given = os.environ.get("NUMBA_CACHE_DIR")
    if given:
        return Path(given)
    folders = {(_ROOT / rel).parent / "__pycache__" for rel in KERNEL_MODULES}
    if all(_writable(folder) for folder in folders):
        return None
    chosen = user_cache_dir()
    os.environ["NUMBA_CACHE_DIR"] = str(chosen)
    numba_config = sys.modules.get("numba.core.config")
    if numba_config is not None:  # Numba already imported (by the user's code): it read the environment then
        numba_config.CACHE_DIR = str(chosen)  # type: ignore[attr-defined]
    return chosen


def _numba_subpath(py_file: Path) -> str:
    """The folder under NUMBA_CACHE_DIR where Numba caches `py_file`'s kernels (Numba's
    `_CacheLocator.get_suitable_cache_subpath`: the folder's name and a SHA-1 of its path)."""
    folder = os.path.dirname(os.path.abspath(py_file))
    return f"{os.path.split(folder)[-1]}_{hashlib.sha1(folder.encode()).hexdigest()}"


def kernel_cache_folders(cache_dir: Path | None) -> dict[str, Path]:
    """Where each kernel module's cached kernels live (module path relative to the package)."""
    if cache_dir is None:
        return {rel: (_ROOT / rel).parent / "__pycache__" for rel in KERNEL_MODULES}
    return {rel: cache_dir / _numba_subpath(_ROOT / rel) for rel in KERNEL_MODULES}


_STAMP: list[str] = []  # kernel_stamp()'s value, once per process


def kernel_stamp() -> str:
    """A SHA-256 of every kernel module's source: what a cached kernel was compiled from."""
    if not _STAMP:
        digest = hashlib.sha256()
        for rel in KERNEL_MODULES:
            path = _ROOT / rel
            if path.exists():
                digest.update(path.read_bytes())
        _STAMP.append(digest.hexdigest())
    return _STAMP[0]


def generated_dir() -> Path:
    """Where schedir writes the kernel modules it generates (a routing pipeline's driver,
    `schedir.lowering.route_driver`): `$XDG_CACHE_HOME/schedir/generated/<stamp>` (a new folder
    whenever a kernel module changes, so a generated kernel never calls stale code); Numba caches
    their machine code beside them, or under NUMBA_CACHE_DIR."""
    return user_cache_dir().parent / "generated" / kernel_stamp()[:16]


def ensure_fresh() -> None:
    if os.environ.get("NUMBA_DISABLE_JIT") == "1":
        return
    cache_dir = choose_cache_dir()
    stamp = kernel_stamp()
    if cache_dir is None:
        marker = _ROOT / "__pycache__" / "kernels.stamp"
    else:  # one stamp per installed copy of schedir sharing this cache folder
        marker = cache_dir / f"schedir-kernels-{hashlib.sha1(str(_ROOT).encode()).hexdigest()[:16]}.stamp"
    try:
        if marker.exists() and marker.read_text() == stamp:
            return
        for rel, folder in kernel_cache_folders(cache_dir).items():
            stem = Path(rel).stem
            for pattern in (f"{stem}.*.nbi", f"{stem}.*.nbc"):
                for stale in folder.glob(pattern):
                    stale.unlink(missing_ok=True)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(stamp)
    except OSError:  # the cache folder cannot be written: Numba falls back to its own user-wide cache, if any
        pass
