"""Which kernel stands for a pass's rule in a lowered program: the one its class writes with it.

A pass's lowered form (a routing pass's `lowered`, a steady answer's `steady_lowered`) is
written rule for rule after its Python rule (`run`, `steady_state` / `steady_order`). A
subclass that writes a rule of its own without a kernel of its own must not inherit its
parent's kernel: it would run the parent's rule. Both programs ask this one test.
"""

from __future__ import annotations

from collections.abc import Sequence


def definer(kind: type, attr: str) -> type | None:
    """The class of `kind`'s MRO that writes `attr` (None: none does)."""
    return next((c for c in kind.__mro__ if attr in c.__dict__), None)


def own_kernel(kind: type, rules: Sequence[str], attr: str, known: Sequence[object]) -> object | None:
    """The kernel `attr` of `kind`, written by a class at least as derived as every class that
    writes one of `rules`, and one of `known` (the program's opcodes); else None."""
    holder = definer(kind, attr)
    if holder is None or not all(issubclass(holder, definer(kind, rule) or object) for rule in rules):
        return None
    kernel = holder.__dict__[attr]
    kernel = getattr(kernel, "__func__", kernel)  # a staticmethod's function
    return kernel if any(kernel is k for k in known) else None
