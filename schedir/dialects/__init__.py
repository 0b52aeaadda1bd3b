"""The dialects: a scheduling step's `sched`, `req` and `mem`, and a routing step's `cluster`."""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin

from schedir.dialects.cluster import Cluster
from schedir.dialects.mem import Mem
from schedir.dialects.req import Req
from schedir.dialects.sched import Sched

DIALECTS = (Sched, Req, Mem, Cluster)


def make_context() -> Context:
    """A context that parses step IR: builtin plus sched, req, mem and cluster."""
    ctx = Context()
    ctx.load_dialect(Builtin)
    for dialect in DIALECTS:
        ctx.load_dialect(dialect)
    return ctx
