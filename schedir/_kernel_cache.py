"""Keep Numba's on-disk kernel cache honest across edits.

`cache=True` keys a compiled kernel on its own file only: when a kernel calls a
kernel from another module (the pool primitives, say) and that module changes,
the caller's cached machine code silently keeps the old callee. So before any
kernel loads, hash the sources of every module with kernels; if they changed
since the cache was written, drop schedir's cached kernels (they recompile once).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

_ROOT = Path(__file__).resolve().parent
KERNEL_MODULES = (
    "lowering/hashing.py", "lowering/kv_pool.py", "lowering/batch_plan.py", "passes/kernels.py",
    "passes/vllm_kernels.py", "runtime/kernels.py", "runtime/table.py", "dialects/codes.py",
    "sim/workloads/tokens.py", "sim/workloads/prefix.py",
)


def ensure_fresh() -> None:
    if os.environ.get("NUMBA_DISABLE_JIT") == "1":
        return
    digest = hashlib.sha256()
    for rel in KERNEL_MODULES:
        path = _ROOT / rel
        if path.exists():
            digest.update(path.read_bytes())
    stamp = digest.hexdigest()
    marker = _ROOT / "__pycache__" / "kernels.stamp"
    try:
        if marker.exists() and marker.read_text() == stamp:
            return
        for rel in KERNEL_MODULES:
            cache_dir = (_ROOT / rel).parent / "__pycache__"
            stem = Path(rel).stem
            for pattern in (f"{stem}.*.nbi", f"{stem}.*.nbc"):
                for stale in cache_dir.glob(pattern):
                    stale.unlink(missing_ok=True)
        marker.parent.mkdir(exist_ok=True)
        marker.write_text(stamp)
    except OSError:  # a read-only install: Numba then caches elsewhere or not at all
        pass
