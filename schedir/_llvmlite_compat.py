"""Make llvmlite's library handle answer only real attribute names.

llvmlite's `ffi.lib` (`_lib_wrapper`) turns *every* missing attribute into a ctypes
function wrapper, `__dict__` included. vLLM 0.32's CPU worker, at start-up, walks every
loaded module's globals and calls `vars(value).get(...)` on each; once numba (hence
llvmlite) is loaded, `vars(llvmlite.binding.ffi.lib)` is such a wrapper and the engine
dies with "'_lib_fn_wrapper' object has no attribute 'get'". So importing schedir before
starting a vLLM engine on CPU (in process, or forked) broke vLLM. Library symbols are
`LLVMPY_*`, never dunder names, so refusing dunder names changes nothing else.
"""

from __future__ import annotations


def patch() -> None:
    from llvmlite.binding import ffi

    wrapper = getattr(ffi, "_lib_wrapper", None)
    original = getattr(wrapper, "__getattr__", None)
    if original is None or getattr(original, "_schedir_patched", False):
        return

    def __getattr__(self: object, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return original(self, name)

    __getattr__._schedir_patched = True  # type: ignore[attr-defined]
    wrapper.__getattr__ = __getattr__  # type: ignore[method-assign]
