"""Numba's kernel cache from an installed, read-only package (issue 18, cold start).

A copy of the package is made read-only (a read-only bind mount in a user namespace when the
tests run as root, which ignores file modes; `chmod a-w` otherwise) and imported in a fresh
process: the kernels must cache in the user cache folder, load from it the next time, be
dropped there when a kernel module changes, and go where NUMBA_CACHE_DIR says when it is set.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import schedir._kernel_cache as kernel_cache

PACKAGE = Path(kernel_cache.__file__).resolve().parent

PROBE = """
import json, os
import numpy as np
import schedir
from schedir.lowering.hashing import block_hash
block_hash(np.int64(0), np.arange(16, dtype=np.int64), 0, 16)
s = block_hash.stats
print(json.dumps({"package": schedir.__file__, "cache_dir": os.environ.get("NUMBA_CACHE_DIR"),
                  "cache_path": s.cache_path, "hits": sum(s.cache_hits.values()), "misses": sum(s.cache_misses.values())}))
"""


def _copy_package(dest: Path) -> Path:
    shutil.copytree(PACKAGE, dest / "schedir", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def _set_writable(root: Path, writable: bool) -> None:
    for folder, _, files in os.walk(root):
        for path in [folder, *(os.path.join(folder, f) for f in files)]:
            mode = os.stat(path).st_mode
            os.chmod(path, mode | stat.S_IWUSR if writable else mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _run_read_only(src: Path, env: dict[str, str]) -> dict[str, object]:
    """Run PROBE with `src` (holding schedir/) first on the path and read-only (from outside the
    repository: `python -c` puts the working folder first on the path)."""
    env = {**env, "PYTHONPATH": str(src), "PYTHONDONTWRITEBYTECODE": "1"}
    if os.geteuid() != 0:
        _set_writable(src, False)
        try:
            proc = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=src.parent, capture_output=True,
                                  text=True, timeout=600, check=False)
        finally:
            _set_writable(src, True)
    else:
        script = (f'mount --bind "{src}" "{src}" && mount -o remount,bind,ro "{src}" && '
                  f'exec "{sys.executable}" -c "$PROBE"')
        proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], env={**env, "PROBE": PROBE}, cwd=src.parent,
                              capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def read_only_ok(tmp_path: Path) -> None:
    if os.environ.get("NUMBA_DISABLE_JIT") == "1":
        pytest.skip("NUMBA_DISABLE_JIT=1: no kernels to cache")
    if os.geteuid() == 0:
        probe = tmp_path / "probe"
        probe.mkdir()
        if shutil.which("unshare") is None:
            pytest.skip("running as root without `unshare`: cannot make a read-only copy of the package")
        script = f'mount --bind "{probe}" "{probe}" && mount -o remount,bind,ro "{probe}" && ! touch "{probe}/x"'
        proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, timeout=60, check=False)
        if proc.returncode != 0:
            pytest.skip("running as root and user namespaces are not allowed: cannot make a read-only copy")


def test_read_only_package_caches_kernels_in_the_user_cache(tmp_path: Path, read_only_ok: None) -> None:
    src = _copy_package(tmp_path / "site-packages")
    xdg = tmp_path / "xdg"
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PYTHONPATH")}
    env["XDG_CACHE_HOME"] = str(xdg)
    user_dir = xdg / "schedir" / "numba"

    first = _run_read_only(src, env)
    assert Path(str(first["package"])).parent == src / "schedir"
    assert first["cache_dir"] == str(user_dir)
    assert str(first["cache_path"]).startswith(str(user_dir))
    assert first["misses"] == 1 and first["hits"] == 0
    assert list(user_dir.glob("*/hashing.block_hash-*.nbi")), sorted(p.name for p in user_dir.rglob("*"))
    assert not list(src.rglob("*.nb[ic]")) and not list(src.rglob("*.stamp"))  # nothing written in the package

    second = _run_read_only(src, env)  # a later process loads the compiled kernel
    assert second["hits"] == 1 and second["misses"] == 0

    # a kernel module changed (an upgrade, an edit): the cached kernels are dropped there too
    pool = src / "schedir" / "lowering" / "kv_pool.py"
    pool.write_text(pool.read_text() + "\n# changed\n")
    third = _run_read_only(src, env)
    assert third["misses"] == 1 and third["hits"] == 0

    # NUMBA_CACHE_DIR set by the user wins
    mine = tmp_path / "mine"
    fourth = _run_read_only(src, {**env, "NUMBA_CACHE_DIR": str(mine)})
    assert fourth["cache_dir"] == str(mine) and str(fourth["cache_path"]).startswith(str(mine))
    assert list(mine.glob("*/hashing.block_hash-*.nbi"))


def test_writable_package_caches_beside_its_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(kernel_cache, "_ROOT", _copy_package(tmp_path) / "schedir")
    assert kernel_cache.choose_cache_dir() is None
    assert "NUMBA_CACHE_DIR" not in os.environ


def test_numba_subpath_matches_numba(tmp_path: Path) -> None:
    """The stale-cache sweep finds Numba's own folder under NUMBA_CACHE_DIR."""
    from numba.core.caching import _CacheLocator

    py_file = PACKAGE / "lowering" / "hashing.py"
    assert kernel_cache._numba_subpath(py_file) == _CacheLocator.get_suitable_cache_subpath(str(py_file))


def test_every_module_with_a_kernel_is_listed() -> None:
    """A kernel calling one from another module keeps the callee's old code in its cache unless
    both are listed (the list is what `ensure_fresh` hashes): a module with a kernel left out
    would run stale machine code after an edit."""
    from schedir import _kernel_cache

    root = Path(_kernel_cache.__file__).resolve().parent
    with_kernels = {str(p.relative_to(root)) for p in root.rglob("*.py")
                    if "njit" in p.read_text() and p.name != "_kernel_cache.py"}
    missing = with_kernels - set(_kernel_cache.KERNEL_MODULES)
    assert not missing, f"modules with Numba kernels missing from KERNEL_MODULES: {sorted(missing)}"
    assert all((root / rel).exists() for rel in _kernel_cache.KERNEL_MODULES)
