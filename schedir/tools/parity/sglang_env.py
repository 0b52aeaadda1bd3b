"""Make SGLang 0.5.23's scheduling classes importable on a CPU-only machine, and say why not.

Why this module exists: `sglang.srt.managers.schedule_policy` imports, through
`schedule_batch`, most of SGLang's model side (multimodal processors, MoE runners,
attention backends). Some of those imports want packages that only make sense on a GPU
machine (torchvision for image processors) and install a CUDA torch as a side effect.
Rather than patch site-packages, the driver calls `install_shims()` before the first
`import sglang`: it puts small stand-ins into `sys.modules` for exactly the packages the
scheduling classes never call but whose import chain touches them. Each stand-in says why
it is there. The scheduling code paths we drive (SchedulePolicy, PrefillAdder, RadixCache,
the token-to-KV allocator, Req) never call into a stand-in.

This module must import with the standard library only: it runs inside SGLang's own
virtual environment (`/work/sgl-env` by default), which does not hold schedir's
dependencies (xDSL, Numba, attrs).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

SGLANG_VERSION = "0.5.23"

INSTALL_HINT = (
    "SGLang's reference environment is missing: build it with the commands in "
    "docs/sglang-reference.md (python -m venv /work/sgl-env; pip install --no-deps "
    f"sglang=={SGLANG_VERSION} plus the listed pure-Python deps and the CPU torch wheel), "
    "or point SCHEDIR_SGLANG_PYTHON at that environment's python"
)


class _Anything:
    """A value that absorbs any use: attribute access, calls, subscripts, subclassing.

    Module-level code in SGLang's multimodal processors does things such as
    `InterpolationMode.BICUBIC` or `T.Compose([...])` at import time; the result is never
    used by the scheduler, so one permissive object stands in for all of them.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> "_Anything":
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Anything()

    def __call__(self, *args: Any, **kwargs: Any) -> "_Anything":
        return _Anything()

    def __getitem__(self, key: Any) -> "_Anything":
        return _Anything()

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (_Anything,)


class _StandInModule(types.ModuleType):
    """A module whose every attribute is an `_Anything`; it is also a package, so
    `import pkg.sub.subsub` resolves through the finder below."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(name, doc=f"schedir stand-in: {why}")
        self.__path__: list[str] = []
        self.__file__ = f"<schedir stand-in for {name}>"
        self.__schedir_stand_in__ = why
        # transformers' `_is_package_available` imports a package that has no dist-info and
        # reads `__version__`; "N/A" would crash its `is_torchvision_greater_or_equal`.
        self.__version__ = "0.0.0"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Anything()


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves `_StandInModule`s for a fixed set of top-level package names and their submodules."""

    def __init__(self, roots: dict[str, str]) -> None:
        self._roots = roots

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        root = fullname.partition(".")[0]
        if root not in self._roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StandInModule(spec.name, self._roots[spec.name.partition(".")[0]])

    def exec_module(self, module: types.ModuleType) -> None:
        return None


STAND_INS: dict[str, str] = {
    "torchvision": (
        "sglang/srt/multimodal/internvl_utils.py and the VLM processors import "
        "torchvision.transforms at module level (reached from schedule_batch via the "
        "multimodal processor registry); the scheduler never transforms an image, and the "
        "only torchvision wheels on PyPI pull a CUDA torch over the CPU one"
    ),
}
"""Top-level packages replaced by stand-ins, and why each one is safe to replace."""


def install_shims() -> None:
    """Install the stand-ins (idempotent). Call before the first `import sglang`."""
    if any(isinstance(f, _StandInFinder) for f in sys.meta_path):
        return
    for root in STAND_INS:
        try:
            __import__(root)
        except ImportError:
            continue
        else:
            STAND_INS_INSTALLED_REAL.add(root)
    roots = {k: v for k, v in STAND_INS.items() if k not in STAND_INS_INSTALLED_REAL}
    sys.meta_path.insert(0, _StandInFinder(roots))


STAND_INS_INSTALLED_REAL: set[str] = set()
"""Stand-in roots skipped because the real package imported (reported by `probe`)."""
