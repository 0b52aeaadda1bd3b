"""The fleet on Ray: each instance is a Ray actor holding its `InstanceCore`; the router stays in the driver.

`RayInstances` implements the fleet loop's `Instances` interface with one actor per instance
(an `Engine` with its own runtime, pipeline, KV pool, cost model and clock, and its own copy
of the request log). The driver runs `FleetSimulator`'s event loop unchanged, so the route
steps, their order and their inputs are the in-process run's; only the instances' calls
cross the wire:

- advance to the next fleet event: one call per instance with steps to run, all in flight
  at once (the instances run in parallel), answered by what changed — the records of the
  requests its steps ran, finished, rejected or preempted (7 numbers each), its new token
  gaps and step rows (9 numbers a step), its next step time and its live facts;
- route: one `add` per instance that received requests (their ids, max tokens and records),
  all in flight at once, answered by the same facts — so a route step reads no actor;
- P/D: `receive` a request's KV; removal: `abort`; end of run: nothing (the driver mirrors
  each instance's step log as it goes, so a lost actor loses none of its past).

The workload is put in the object store once and each actor reads its prompts from it.
An actor that dies (killed, its node gone) raises `InstanceLost` from the call that finds
it; the loop then routes again every request it had routed there and not seen settle.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from schedir.sim.config import SimConfig
from schedir.sim.cost_model import CostModel
from schedir.sim.engine import Engine
from schedir.sim.fleet_instances import FACTS, Advanced, Copied, InstanceCore, InstanceLost, copy_between
from schedir.sim.records import RequestLog, StepLog
from schedir.sim.workloads import Workload

INSTALL_HINT = "install it with: python -m pip install 'ray>=2.40' (or pip install 'schedir[ray]')"
READY_TIMEOUT_S = 180.0


LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def import_ray(local: bool = False) -> Any:
    """The `ray` module, or a ValueError saying how to install it. `local`: a Ray instance this
    process starts serves this machine only, its services on the loopback address (Ray reads the
    switch when imported: by default it binds the machine's network address, for other nodes)."""
    if local and "ray" not in sys.modules:
        os.environ.setdefault(LOCAL_ONLY, "0")
    try:
        import ray
    except ImportError:
        raise ValueError(f"--backend ray: Ray is not installed; {INSTALL_HINT}") from None
    return ray


def records_of(reqs: RequestLog, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Requests `ids`' records: (first scheduled, first token, last token, finish) seconds and
    (tokens out, prefix hit, preemptions) — all a step reads or writes of a request."""
    f = np.stack([reqs.first_scheduled_s[ids], reqs.first_token_s[ids], reqs.last_token_s[ids], reqs.finish_s[ids]])
    i = np.stack([reqs.tokens_out[ids], reqs.prefix_hit_tokens[ids], reqs.preemptions[ids]])
    return f, i


def write_records(reqs: RequestLog, ids: np.ndarray, f: np.ndarray, i: np.ndarray) -> None:
    reqs.first_scheduled_s[ids], reqs.first_token_s[ids], reqs.last_token_s[ids], reqs.finish_s[ids] = f
    reqs.tokens_out[ids], reqs.prefix_hit_tokens[ids], reqs.preemptions[ids] = i


def own_error(e: Exception) -> Exception:
    """The instance's own exception (a bad pipeline's, the engine's) out of Ray's wrapper, so the
    caller sees what the in-process run raises (one line at the CLI, not a remote traceback)."""
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, Exception) else e


@attrs.frozen
class Reply:
    """An actor's answer to any call: its state for the router and what changed since its last answer."""

    next_t: float
    busy: bool
    facts: tuple[int, int, int, int, int]
    finished: list[int] = attrs.Factory(list)
    rejected: list[int] = attrs.Factory(list)
    why: dict[int, str] = attrs.Factory(dict)  # rejected request -> reason
    ids: np.ndarray | None = None  # requests whose records changed, and those records
    rec_f: np.ndarray | None = None
    rec_i: np.ndarray | None = None
    gaps: np.ndarray | None = None  # token gaps, in the order they happened
    steps: np.ndarray | None = None  # step rows (STEP_FIELDS)


class InstanceActor:
    """The body of one instance's Ray actor (decorated with `ray.remote` when a fleet starts)."""

    def __init__(self) -> None:
        self.core: InstanceCore | None = None

    def reset(self, config: SimConfig, sizes: tuple[CostModel, int, int, int], workload: Workload,
              kind: str = "sim") -> int:
        """A fresh instance for a new run (an actor serves run after run: starting one costs seconds).
        `kind`: "sim", the simulator's Engine; "vllm", a real vLLM engine on schedir's scheduler."""
        self.reqs = RequestLog(workload.arrival_s, workload.input_len, workload.output_len)
        self.steps = StepLog(1024)
        if kind == "vllm":
            from schedir.sim.vllm_instance import VllmEngine

            engine: Any = VllmEngine(config, self.reqs, self.steps, sizes)
        else:
            engine = Engine(config, self.reqs, self.steps, sizes)
        self.core = InstanceCore(engine, workload)
        self.core.touched = []
        self.gaps_sent = 0
        self.steps_sent = 0
        return os.getpid()

    def ping(self) -> int:
        return os.getpid()

    def engine_name(self) -> str:
        """What this actor's instance runs (`Engine`, `VllmEngine`)."""
        return type(self._core().engine).__name__

    def _core(self) -> InstanceCore:
        if self.core is None:
            raise RuntimeError("instance actor used before reset()")
        return self.core

    def _reply(self, finished: list[int] | None = None, rejected: list[int] | None = None) -> Reply:
        core = self.core
        assert core is not None
        touched = core.touched
        assert touched is not None
        reply_ids = rec_f = rec_i = gaps = steps = None
        if touched:
            reply_ids = np.unique(np.concatenate(touched))
            touched.clear()
            rec_f, rec_i = records_of(self.reqs, reply_ids)
        reqs = self.reqs
        if reqs.gap_count > self.gaps_sent:
            gaps = reqs.gap_buf[self.gaps_sent: reqs.gap_count].copy()
            self.gaps_sent = reqs.gap_count
        if self.steps.size > self.steps_sent:
            steps = self.steps._rows[self.steps_sent: self.steps.size].copy()
            self.steps_sent = self.steps.size
        rejected = rejected or []
        return Reply(core.next_t, core.engine.busy, core.facts(), finished or [], rejected,
                     {r: reqs.rejected[r] for r in rejected}, reply_ids, rec_f, rec_i, gaps, steps)

    def add(self, ids: np.ndarray, max_tokens: np.ndarray, rec_f: np.ndarray, rec_i: np.ndarray, at: float) -> Reply:
        write_records(self.reqs, ids, rec_f, rec_i)  # a re-routed or handed-over request's past
        self._core().add(ids, max_tokens, at)
        return self._reply()

    def receive(self, r: int, max_tokens: int, rec_f: np.ndarray, rec_i: np.ndarray, at: float) -> Reply:
        ids = np.array([r], dtype=np.int64)
        write_records(self.reqs, ids, rec_f, rec_i)
        self._core().receive(r, max_tokens, at)
        return self._reply()

    def advance(self, until: float, max_steps: int) -> Reply:
        a = self._core().advance(until, max_steps)
        return self._reply(a.finished, a.rejected)

    def abort(self) -> tuple[list[int], Reply]:
        names = self._core().abort_all()
        return names, self._reply()

    def stalled(self) -> str:
        return self._core().stalled()

    def caches_prefixes(self) -> bool:
        """Whether this instance's pool can take a copied prefix (a hashed prefix cache)."""
        return self._core().prefix_hashes(np.zeros(0, dtype=np.int64)) is not None

    def cached_prefix(self, content: np.ndarray) -> int:
        return self._core().cached_prefix(content)

    def adopt_prefix(self, content: np.ndarray, blocks: int) -> int:
        return self._core().adopt_prefix(content, blocks)

    def drop_prefix(self, content: np.ndarray, blocks: int) -> int:
        return self._core().drop_prefix(content, blocks)


class RayInstances:
    """The `Instances` of a fleet as Ray actors, one per instance (needs `ray.init` done)."""

    def __init__(self, config: SimConfig, reqs: RequestLog, logs: Sequence[StepLog],
                 sizes: tuple[CostModel, int, int, int], workload: Workload, actors: Sequence[Any],
                 num_cpus: float = 1.0, on_close: Any = None, kind: str = "sim") -> None:
        ray = self.ray = import_ray()
        if not ray.is_initialized():
            raise RuntimeError("RayInstances needs ray.init() first (RayBackend does it)")
        self.reqs = reqs
        self.logs = list(logs)
        m = len(self.logs)
        self.next_t = np.full(m, math.inf)
        self.busy = np.zeros(m, dtype=bool)
        self.cached_facts = np.zeros((m, len(FACTS)), dtype=np.int64)
        self.lost: set[int] = set()
        self.on_close = on_close
        self.actors = list(actors)
        shared = ray.put(workload)
        resets = [a.reset.remote(config, sizes, shared, kind) for a in self.actors]
        try:
            ray.get(resets, timeout=READY_TIMEOUT_S)
        except ray.exceptions.RayTaskError as e:
            for ref in resets:  # every actor fails alike: fetch each error, or Ray logs the rest later,
                try:  # a traceback after the one-line error (and into the next run of a test process)
                    ray.get(ref, timeout=READY_TIMEOUT_S)
                except Exception:  # noqa: BLE001, S110 - the first one is the error reported
                    pass
            raise own_error(e) from None
        except ray.exceptions.GetTimeoutError:
            cpus = ray.cluster_resources().get("CPU", 0)
            raise ValueError(f"--backend ray: {m} instance actors ({num_cpus:g} CPU each) did not start within "
                             f"{READY_TIMEOUT_S:g} s; the Ray cluster has {cpus:g} CPUs") from None

    def _get(self, i: int, ref: Any) -> Any:
        exceptions = self.ray.exceptions
        try:
            return self.ray.get(ref)
        except exceptions.RayActorError as e:
            self.lost.add(i)
            self.next_t[i] = math.inf
            self.busy[i] = False
            raise InstanceLost(i, type(e).__name__) from None
        except exceptions.RayTaskError as e:
            raise own_error(e) from None

    def _apply(self, i: int, reply: Reply) -> None:
        reqs = self.reqs
        if reply.ids is not None:
            write_records(reqs, reply.ids, reply.rec_f, reply.rec_i)
        if reply.gaps is not None:
            reqs.add_gaps(reply.gaps)
        for r, why in reply.why.items():
            reqs.rejected[r] = why
        if reply.steps is not None:
            log = self.logs[i]
            for row in reply.steps:
                log.append(*row.tolist())
        self.next_t[i] = reply.next_t
        self.busy[i] = reply.busy
        self.cached_facts[i] = reply.facts

    def add(self, batches: Mapping[int, tuple[np.ndarray, np.ndarray]], at: float) -> list[int]:
        refs = {}
        for i, (ids, max_tokens) in batches.items():
            if i not in self.lost:
                refs[i] = self.actors[i].add.remote(ids, max_tokens, *records_of(self.reqs, ids), at)
        lost = [i for i in batches if i in self.lost]
        for i, ref in refs.items():  # all in flight; collected in instance order
            try:
                self._apply(i, self._get(i, ref))
            except InstanceLost:
                lost.append(i)
        return lost

    def receive(self, instance: int, r: int, max_tokens: int, at: float) -> None:
        if instance in self.lost:
            raise InstanceLost(instance, "lost earlier")
        f, i = records_of(self.reqs, np.array([r], dtype=np.int64))
        self._apply(instance, self._get(instance, self.actors[instance].receive.remote(r, max_tokens, f, i, at)))

    def advance(self, which: Sequence[int], until: float, max_steps: int = -1) \
            -> tuple[dict[int, Advanced], list[int]]:
        refs = {i: self.actors[i].advance.remote(until, max_steps) for i in which if i not in self.lost}
        lost = [i for i in which if i in self.lost]
        done: dict[int, Advanced] = {}
        for i, ref in refs.items():  # the instances run in parallel; their answers are applied in instance order
            try:
                reply = self._get(i, ref)
            except InstanceLost:
                lost.append(i)
                continue
            self._apply(i, reply)
            done[i] = Advanced(reply.finished, reply.rejected, reply.next_t, reply.busy)
        return done, lost

    def facts(self, live: np.ndarray) -> np.ndarray:
        return self.cached_facts[live]

    def abort(self, instance: int) -> list[int]:
        if instance in self.lost:
            raise InstanceLost(instance, "lost earlier")
        names, reply = self._get(instance, self.actors[instance].abort.remote())
        self._apply(instance, reply)
        self.next_t[instance] = math.inf
        self.busy[instance] = False
        return names

    def copy_prefix(self, src: int, dst: int, content: np.ndarray, migrate: bool) -> Copied:
        """The copy's calls, one at a time (copies are rare): the source's holding, the target's take, the drop."""
        for i in (src, dst):
            if i in self.lost:
                raise InstanceLost(i, "lost earlier")
        source, target = self.actors[src], self.actors[dst]
        return copy_between(lambda c: self._get(src, source.cached_prefix.remote(c)),
                            lambda c, b: self._get(dst, target.adopt_prefix.remote(c, b)),
                            lambda c, b: self._get(src, source.drop_prefix.remote(c, b)), content, migrate,
                            self._get(dst, target.caches_prefixes.remote()))

    def kill(self, instance: int) -> None:
        """Kill the instance's actor (no restart) and wait until a call on it fails, as a crash would show."""
        self.ray.kill(self.actors[instance], no_restart=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self._get(instance, self.actors[instance].ping.remote())  # raises InstanceLost once it is gone
            time.sleep(0.05)
        raise RuntimeError(f"instance {instance}: its Ray actor still answers 60 s after ray.kill")

    def stalled(self, instance: int) -> str:
        return str(self._get(instance, self.actors[instance].stalled.remote()))

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close(self)


@attrs.define
class RayBackend:
    """A `Backend` for `FleetSimulator`: starts (or joins, with `address`) a Ray cluster on
    first use and places one actor per instance, `num_cpus` logical CPUs each."""

    address: str | None = None
    num_cpus: float = 1.0
    kind: str = "sim"  # what each actor runs: the simulator's Engine, or "vllm" (schedir.sim.vllm_instance)
    started: bool = False
    pool: list[Any] = attrs.Factory(list)  # live actors, reused run after run

    def connect(self, instances: int) -> None:
        ray = import_ray(local=not self.address)
        if ray.is_initialized():
            return
        if self.address:
            try:
                ray.init(address=self.address, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ValueError(f"--ray-address {self.address!r}: cannot connect to a Ray cluster: "
                                 f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        else:
            import schedir

            root = os.path.dirname(os.path.dirname(os.path.abspath(schedir.__file__)))
            path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
            # a local cluster: enough logical CPUs for one actor per instance (they take turns on the cores)
            ray.init(num_cpus=max(math.ceil(instances * self.num_cpus), os.cpu_count() or 1),
                     include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": path}})
        self.started = True

    def __call__(self, config: SimConfig, reqs: RequestLog, logs: list[StepLog],
                 sizes: tuple[CostModel, int, int, int], workload: Workload) -> RayInstances:
        self.connect(len(logs))
        ray = import_ray()
        actor = ray.remote(num_cpus=self.num_cpus, max_restarts=0, max_task_retries=0)(InstanceActor)
        self.pool = [a for a in self.pool if self._answers(a)]  # one that died between runs is replaced
        while len(self.pool) < len(logs):
            self.pool.append(actor.remote())
        if self.kind == "vllm":
            from schedir.sim.vllm_instance import check_vllm_config

            check_vllm_config(config, sizes[1])
        return RayInstances(config, reqs, logs, sizes, workload, self.pool[: len(logs)], num_cpus=self.num_cpus,
                            on_close=self._returned, kind=self.kind)

    @staticmethod
    def _answers(actor: Any) -> bool:
        ray = import_ray()
        try:
            ray.get(actor.ping.remote(), timeout=READY_TIMEOUT_S)
        except ray.exceptions.RayActorError:
            return False
        return True

    def _returned(self, instances: RayInstances) -> None:
        """A run ended: its lost actors leave the pool (dead actors answer nothing)."""
        dead = {id(instances.actors[i]) for i in instances.lost}
        self.pool = [a for a in self.pool if id(a) not in dead]

    def shutdown(self) -> None:
        """Kill this backend's actors, and stop the Ray instance it started (a joined cluster is left running)."""
        ray = import_ray()
        for a in self.pool:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.pool = []
        if self.started:
            import_ray().shutdown()
            self.started = False


__all__ = ["InstanceActor", "RayBackend", "RayInstances", "Reply", "import_ray"]
