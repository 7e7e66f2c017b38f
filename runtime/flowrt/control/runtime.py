"""The embedded runtime: a loaded bundle, its roles' implementations, and graph calls.

    runtime = await Runtime.open("build/image_chat")
    async for event in runtime.call("chat", {"request": {...}}, session="s1"):
        ...
    await runtime.close()

Calls of one session run one at a time in arrival order (GCScheduler); calls of different
sessions run concurrently. A call's lifecycle is admission (its session's turn), the call, and
retirement (its turn released, its session's state kept or dropped); retirement belongs to the
call's end, not to its caller, so a caller that goes away in any way (a closed iterator, a
cancelled task, a failed write) never leaves a call or a session behind. Every stateful piece
reports `statistics()` so tests can assert that nothing outlives its call.

`observer` (None, or hooks from flowrt.observe: metrics, say) hears of every call and
activation; a call may name its own instead (`call(..., observer=)`: a trace of that call).

A graph with streaming entries takes their frames while it runs: `start` gives a handle that
sends them and yields the events (flowrt.control.inputs); `call` takes each one's frames as a list.
A call made with `interrupt` cancels its session's running call of an `interruptible` graph
(flowrt.control.interrupts).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from difflib import get_close_matches
from pathlib import Path
from typing import Any

from flowrt import options
from flowrt.bundle import Bundle, BundleError, load_bundle, refuse_streaming_entries
from flowrt.control import impls
from flowrt.control.call import Call
from flowrt.control.inputs import CallHandle, fed_events, frames_of
from flowrt.control.interrupts import REASON, Interrupts
from flowrt.control.program import GraphProgram
from flowrt.control.roles import Context, RoleBinding
from flowrt.control.sessions import PREFIX_SCOPE, SCOPE_KEY, GCScheduler, SessionStore, anonymous_session, reserved
from flowrt.control.threads import ReplicaThread, streams
from flowrt.entry_types import EntryTypeError, checker
from flowrt.errors import BadInputs, BadTimeout, FlowrtError, InputClosed, RoleError, UnknownGraph, place
from flowrt.options import DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_TTL
from flowrt.tables import RoleSpec, interruptible, node_tables

__all__ = [
    "BadInputs",
    "BadTimeout",
    "CallHandle",
    "FlowrtError",
    "GCScheduler",
    "InputClosed",
    "RoleError",
    "Runtime",
    "UnknownGraph",
]


class Runtime:
    def __init__(
        self,
        bundle: Bundle,
        *,
        session_ttl: float = DEFAULT_SESSION_TTL,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.bundle = bundle
        self.memory: Any = None  # roles' ctx.memory (set by `open`)
        self.binder: Any = None
        self.roles: dict[str, RoleSpec] = bundle.roles
        try:
            self.programs: dict[str, GraphProgram] = {
                graph: GraphProgram(graph, plan, {node_id: node_tables(node) for node_id, node in plan["nodes"].items()})
                for graph, plan in bundle.plan["graphs"].items()
            }
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise BundleError(
                f"the tables of {bundle.path} (graphs.py, nodes/) are malformed ({type(error).__name__}: {error}); "
                "rebuild the bundle with `flowc build`"
            ) from None
        # per graph: the check of each entry placeholder whose declared type restricts its value
        self.entry_checks: dict[str, dict[str, Callable[[Any], Any]]] = {}
        for graph, summary in bundle.manifest.get("graphs", {}).items():
            types = summary.get("types", {}) if isinstance(summary, dict) else {}
            self.entry_checks[graph] = {
                name: check for name, text in sorted(types.items()) if (check := checker(str(text))) is not None
            }
        self.entry_types: dict[str, dict[str, str]] = {
            graph: dict(summary.get("types", {})) for graph, summary in bundle.manifest.get("graphs", {}).items()
        }
        self.instances: dict[str, list[Any]] = {}
        self.bindings: dict[str, RoleBinding] = {}
        # the state of each global a role `uses`, per session: (session, name) -> dict
        self.globals: dict[tuple[str, str], dict[str, Any]] = defaultdict(dict)
        self.global_names = sorted({name for role in self.roles.values() for name in role.uses})
        declared = bundle.plan.get("globals") or {}
        self.kv_globals = [name for name in self.global_names if (declared.get(name) or {}).get("kind") == "KVCache"]
        self.scheduler = GCScheduler()
        self.interrupts = Interrupts(frozenset(g for g, plan in bundle.plan["graphs"].items() if interruptible(g, plan)))
        self.sessions = SessionStore(
            self.globals,
            self.global_names,
            options.session_ttl_seconds(session_ttl),
            options.session_cap(max_sessions),
            clock,
        )
        self.calls: set[Call] = set()
        self.call_ids = itertools.count(1)
        self.log = logging.getLogger(f"flowrt.{bundle.name}")
        self.last_call: Call | None = None  # the most recent finished call, for inspection
        self._idle_waiters: list[asyncio.Future] = []  # wait_idle() callers, woken when no call is in flight
        self._retiring: set[asyncio.Task] = set()  # calls whose caller left, retired when they end
        self.observer: Any = None  # what every call reports to (flowrt.observe), unless it names its own
        # a gateway whose calls spread over processes (flowrt.control.shards): it attaches each call's router
        self.shards: Any = None

    @classmethod
    async def open(
        cls,
        path: str | Path,
        instances: dict[str, list[Any]] | None = None,
        *,
        session_ttl: float = DEFAULT_SESSION_TTL,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
        binder: Any = None,
        memory: Any = None,
    ) -> Runtime:
        """Load a bundle, import, construct and check its roles, and run their `setup`
        (`instances` overrides impls, e.g. in tests). Idle sessions keep their state for
        `session_ttl` seconds, at most `max_sessions` of them (`clock` tells the time).

        With a `binder` (flowrt.deploy), the roles run elsewhere: nothing is imported here;
        `binder.binding(spec, globals, log)` gives each role's binding and
        `binder.generator(role, interface)` says whether an interface streams frames and
        `binder.retired(call_id)` hears of each call that ended.
        `memory` is what roles see as `ctx.memory` (flowrt.memory.api; open_deployment gives one)."""
        runtime = cls(load_bundle(Path(path)), session_ttl=session_ttl, max_sessions=max_sessions, clock=clock)
        runtime.memory = memory
        if binder is None:
            await runtime._instantiate(instances or {})
        else:
            runtime._bind(binder)
        return runtime

    async def close(self) -> None:
        """Cancel the calls in flight (reason "shutdown") and wait until each has ended."""
        self.cancel_all("shutdown")
        for call in list(self.calls):
            await call.wait_ended()
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
        self.sessions.close()
        for binding in self.bindings.values():
            binding.close()

    def refuse_streaming_entries(self, how: str) -> None:
        """BundleError naming each graph with a streaming entry, whose frames only this
        process's calls (`start`, `call`) take: not yet a bundle run `how` (served over HTTP, say)."""
        refuse_streaming_entries(self.bundle, how)

    def cancel_all(self, reason: str) -> None:
        """Cancel every call in flight; their `done` events say `reason`."""
        for call in list(self.calls):
            call.cancel(reason)

    def fail_all(self, message: str, where: str) -> None:
        """End every call in flight with status "error": `where` (a part of the deployment) failed."""
        for call in list(self.calls):
            call.fail(message, where)

    # ── roles ──

    async def _instantiate(self, overrides: dict[str, list[Any]]) -> None:
        python_path = self.bundle.python_path
        for name, role in sorted(self.roles.items()):
            if name in overrides:
                self.instances[name] = list(overrides[name])
            else:
                cls = impls.import_impl(role, python_path, self.bundle.path)
                self.instances[name] = impls.construct(role, cls, python_path)
            for instance in self.instances[name]:
                impls.check_instance(role, instance)
        prefer = tuple(python_path)
        for name, role in sorted(self.roles.items()):
            binding = self.bindings[name] = RoleBinding(role, self.instances[name], self.globals, self.log, self.memory, prefer)
            for replica, instance in enumerate(self.instances[name]):
                setup = getattr(instance, "setup", None)
                if setup is not None:
                    await self._setup(name, replica, setup, binding.threads[replica])
        self._bind_nodes(self.roles)

    def host(self, role: str, instance: Any, thread: ReplicaThread, binding_class: Callable = RoleBinding) -> None:
        """Bind one replica's instance, constructed and set up already (its `thread` runs its
        plain methods), as the only one of `role`: a process hosting that replica's part of
        every call (flowrt.control.shards; flowrt.control.shard_binding.ShardBinding is the `binding_class`)."""
        spec = self.roles[role]
        self.instances[role] = [instance]
        prefer = tuple(self.bundle.python_path)
        binding = self.bindings[role] = binding_class(spec, [instance], self.globals, self.log, self.memory, prefer)
        binding.threads[0] = thread
        self._bind_nodes({role})

    def _bind_nodes(self, hosted: Collection[str]) -> None:
        for program in self.programs.values():
            for node in program.nodes:
                if node.interface and node.role in hosted:
                    binding = node.binding = self.bindings[node.role]
                    node.methods = binding.methods(node.method)
                    node.generator = any(streams(getattr(i, node.method, None)) for i in binding.instances)
                    node.timeout = self.roles[node.role].interfaces[node.method].timeout_s

    def _bind(self, binder: Any) -> None:
        self.binder = binder
        for name, role in sorted(self.roles.items()):
            self.instances[name] = []
            self.bindings[name] = binder.binding(role, self.globals, self.log)
        for program in self.programs.values():
            for node in program.nodes:
                if node.interface:
                    binding = node.binding = self.bindings[node.role]
                    node.methods = [None] * binding.count
                    node.generator = binder.generator(node.role, node.method)
                    node.timeout = self.roles[node.role].interfaces[node.method].timeout_s

    async def _setup(self, role: str, replica: int, setup: Any, thread: ReplicaThread) -> None:
        ctx = Context("", 0, "", role, "setup", {}, self.log, replica, self.memory)
        try:
            await thread.setup(setup, ctx)
        except Exception as error:  # noqa: BLE001 - the user's setup: a clear error, not a traceback
            self.log.debug("role %s: setup of replica %d raised", role, replica, exc_info=True)
            where = place(error, self.bundle.python_path)
            raise RoleError(
                f"role `{role}`: setup() of replica {replica} raised {type(error).__name__}: {error}"
                + (f" at {where}" if where else "")
                + "; fix setup (it runs once per replica when the runtime opens)"
            ) from None

    # ── calls ──

    async def call(
        self,
        graph: str,
        inputs: dict[str, Any],
        session: str | None = None,
        timeout: float | None = None,
        observer: Any = None,
        interrupt: bool = False,
    ) -> AsyncIterator[dict]:
        """Call a graph; yields its events (stream, return, done) as dicts. Bad inputs raise
        UnknownGraph, BadInputs (a session that is not a str too) or BadTimeout at the first step. `observer` (flowrt.observe)
        hears of this call instead of the runtime's `observer`. A streaming entry's value is the
        list of its frames, sent while the call runs, then ended (`start` sends them one by one).
        `interrupt`: cancel the session's running call of an interruptible graph (flowrt.control.interrupts)."""
        program, inputs, deadline = self._prepare(graph, inputs, timeout, session, interrupt)
        if program.entry_stream:
            events = fed_events(self, program, inputs, session, deadline, observer, interrupt)
            try:
                async for event in events:
                    yield event
            finally:
                await events.aclose()
            return
        call, watchdog, anonymous = await self._admit(program, inputs, session, deadline, observer, interrupt)
        try:
            call.start()
            outbox = call.outbox
            loop = call.loop
            taken = self.interrupts.taken.get(call)  # (a call of an interruptible graph: what its caller took)
            while True:
                if not outbox:
                    call.waiter = loop.create_future()
                    await call.waiter
                event = outbox.popleft()
                if call.outbox_waiters:
                    call.taken()
                if event is None:
                    break
                if taken is None or taken.take(event):
                    yield event
        finally:
            await self._leave(call, watchdog, anonymous)

    def call_batches(
        self,
        graph: str,
        inputs: dict[str, Any],
        session: str | None = None,
        timeout: float | None = None,
        observer: Any = None,
        interrupt: bool = False,
    ) -> AsyncIterator[list[dict]]:
        """Like `call`, but bad inputs raise here, at once, and the events come in lists: all
        the events ready when the caller asks, so a server can write them at once."""
        program, inputs, deadline = self._prepare(graph, inputs, timeout, session, interrupt)
        if program.entry_stream:
            raise BadInputs(
                f"graph `{graph}` has streaming entries ({', '.join(program.entry_stream)}): call it with `call` "
                "(each one's frames as a list) or `start` (sent one by one)"
            )
        return self._batches(program, inputs, session, deadline, observer, interrupt)

    def start(
        self,
        graph: str,
        inputs: dict[str, Any],
        session: str | None = None,
        timeout: float | None = None,
        observer: Any = None,
        interrupt: bool = False,
    ) -> CallHandle:
        """Start a call whose streaming entries' frames the caller sends while it runs:
        `inputs` gives the other entries; the handle sends (`await h.send(field, value)`), ends
        (`await h.end(field)`), yields the events (`async for event in h`) and cancels
        (`await h.cancel()`); flowrt.control.inputs. The call is admitted when the handle is
        first used. UnknownGraph, BadInputs or BadTimeout at once. `interrupt` as for `call`."""
        program, checked = self.check_inputs(graph, inputs, fed=True)
        deadline = self._deadline(program, timeout)
        self._check_session(program, session, interrupt)
        return CallHandle(self, program, checked, session, deadline, observer, interrupt)

    async def _batches(
        self, program: GraphProgram, inputs: dict, session: str | None, deadline: float | None, observer: Any, interrupt: bool
    ) -> AsyncIterator[list[dict]]:
        call, watchdog, anonymous = await self._admit(program, inputs, session, deadline, observer, interrupt)
        try:
            call.start()
            outbox = call.outbox
            loop = call.loop
            taken = self.interrupts.taken.get(call)
            while True:
                if not outbox:
                    call.waiter = loop.create_future()
                    await call.waiter
                batch = list(outbox)
                outbox.clear()
                if call.outbox_waiters:
                    call.taken()
                if taken is not None:
                    batch = [event for event in batch if event is None or taken.take(event)]
                    if not batch:
                        continue
                if batch[-1] is None:  # the call's last event is followed by None
                    batch.pop()
                    if batch:
                        yield batch
                    break
                yield batch
        finally:
            await self._leave(call, watchdog, anonymous)

    def _prepare(
        self, graph: str, inputs: dict[str, Any], timeout: float | None, session: Any = None, interrupt: bool = False
    ) -> tuple[GraphProgram, dict, float | None]:
        program, checked = self.check_inputs(graph, inputs)
        if interrupt:
            self._check_session(program, session, interrupt)
        return program, checked, self._deadline(program, timeout)

    def _deadline(self, program: GraphProgram, timeout: float | None) -> float | None:
        if timeout is None:
            return program.timeout
        try:
            return options.timeout_seconds(timeout)
        except ValueError as error:
            raise BadTimeout(f"timeout: {error}") from None

    def _check_session(self, program: GraphProgram, session: str | None, interrupt: bool = False) -> None:
        """BadInputs for a session that is not a str, or that no caller may name; or none with `interrupt`."""
        if interrupt and session is None:
            raise BadInputs(
                f"graph `{program.name}`: `interrupt` cancels the running call of the caller's session, and this call "
                "names none; pass the conversation's session (session=...)"
            )
        if session is not None and type(session) is not str:
            raise BadInputs(
                f"graph `{program.name}`: session must be a str (or None: a session of the call's own), "
                f"not {type(session).__name__} {session!r:.60}; pass str(session) to use it as one"
            )
        if session is not None and reserved(session):
            raise BadInputs(f"graph `{program.name}`: {reserved(session)}")

    async def _admit(
        self,
        program: GraphProgram,
        inputs: dict,
        session: str | None,
        deadline: float | None,
        observer: Any = None,
        interrupt: bool = False,
    ) -> tuple[Call, asyncio.TimerHandle | None, bool]:
        """Wait for the session's turn (with `interrupt`, after cancelling the calls of interruptible
        graphs ahead: flowrt.control.interrupts); the call (not started; cancelled if a later call
        interrupted it while it waited), its watchdog, and whether its session is its own. A
        session that is not a str is BadInputs."""
        self._check_session(program, session, interrupt)
        interrupts = self.interrupts
        record = waiting = None
        call_id = next(self.call_ids)
        if session is None:
            session = anonymous_session()  # its own session: unguessable, and no caller can name it
            anonymous = True
        else:
            anonymous = False
            self.sessions.busy(session)
            if interrupt:
                record, cancelled = interrupts.interrupt(session, self.calls)
                for stopped in cancelled:  # (each leaves the session once it has ended, read or not)
                    self._retire_soon(stopped, False)
        if not self.scheduler.enter(session):
            waiting = interrupts.wait(session, program.name, record)
            try:
                await self.scheduler.acquire(session)
            except BaseException:
                if session not in self.scheduler.queues:
                    self._rest(session, anonymous)
                    self._wake_idle()
                raise
            finally:
                interrupts.admitted(session, waiting)
        if self.kv_globals:  # the caller's prefix scope travels with the session's KV state (flowrt.control.sessions)
            scope = PREFIX_SCOPE.get()
            if scope is not None:
                for name in self.kv_globals:
                    self.globals[(session, name)][SCOPE_KEY] = scope
        call = Call(self, program, inputs, session, call_id)
        call.observer = self.observer if observer is None else observer
        call.track_frames = bool(getattr(call.observer, "frames", False))  # (a trace's arrows need them)
        observer = call.observer
        call.watch_output = observer is not None  # (the time to the first output: timed, or heard where the observer asks)
        call.hear_first_output = getattr(observer, "first_output", None) is not None
        call.watch_starts = observer is not None and bool(getattr(observer, "starts", True))  # (an observer may not need them)
        call.watch_ends = observer is not None and bool(getattr(observer, "ends", True))
        if self.shards is not None:
            self.shards.attach(call)
        self.calls.add(call)
        if waiting is not None and waiting.interrupted:  # a later call interrupted it while it waited: it never runs
            call.cancel(REASON)
            self._retire_soon(call, anonymous)
        interrupts.started(call, None if call.cancelled else record, self.globals, self.global_names)
        watchdog = call.loop.call_later(deadline, call.cancel, "timeout") if deadline else None
        return call, watchdog, anonymous

    async def _leave(self, call: Call, watchdog: asyncio.TimerHandle | None, anonymous: bool) -> None:
        """The caller is done with `call`: retire it now if it has ended; else cancel it
        ("client gone") and wait for its end, which retires it even if this wait is cancelled
        in turn (a server's handler is cancelled when its client disconnects, possibly while
        it is already closing the call after a failed write)."""
        if watchdog is not None:
            watchdog.cancel()
        if call.ended:
            self._retire(call, anonymous)
            return
        call.cancel("client gone")
        await asyncio.shield(self._retire_soon(call, anonymous))

    def _retire_soon(self, call: Call, anonymous: bool) -> asyncio.Future:
        """Retire `call` once it has ended, whoever waits for that (a task the runtime's `close` awaits)."""
        retiring = asyncio.ensure_future(self._retire_when_ended(call, anonymous))
        self._retiring.add(retiring)
        retiring.add_done_callback(self._retiring.discard)
        return retiring

    async def _retire_when_ended(self, call: Call, anonymous: bool) -> None:
        await call.wait_ended()
        self._retire(call, anonymous)

    def _retire(self, call: Call, anonymous: bool) -> None:
        """The call has ended and its caller is gone (or it was interrupted): release its session's
        turn, keep or drop the session's state, and wake `wait_idle` callers if nothing is in
        flight. Once: a call already retired is not in `calls`."""
        if call not in self.calls:
            return
        self.calls.discard(call)
        self.interrupts.retired(call, self.globals)
        if self.binder is not None:
            self.binder.retired(call.call_id)  # (what it held elsewhere, shared memory say, is released)
        session = call.session
        self.scheduler.release(session)
        if session not in self.scheduler.queues:
            self._rest(session, anonymous)
        self.last_call = call
        self._wake_idle()

    def _wake_idle(self) -> None:
        if self._idle_waiters and not self.calls and not self.scheduler.queues:
            for waiter in self._idle_waiters:
                if not waiter.done():
                    waiter.set_result(None)
            self._idle_waiters.clear()

    def _rest(self, session: str, anonymous: bool) -> None:
        """No call of `session` is running or queued any more."""
        if anonymous:
            self.sessions.drop(session)
        else:
            self.sessions.rest(session)

    def check_inputs(self, graph: str, inputs: dict[str, Any], fed: bool = False) -> tuple[GraphProgram, dict[str, Any]]:
        """The program of `graph` and the inputs as its roles get them (a base64 string for a
        `Bytes` placeholder becomes bytes); UnknownGraph or BadInputs saying why not. A streaming
        entry's value is the list of its frames; `fed`: the inputs of `start`, without them."""
        program = self.validate(graph, inputs, types=False, fed=fed)
        checks = self.entry_checks.get(graph)
        streaming = program.entry_stream
        if not checks and (fed or not streaming):
            return program, inputs
        checked = dict(inputs)
        for name in () if fed else streaming:
            checked[name] = frames_of(self, program, name, inputs[name])
        for name, check in (checks or {}).items():
            if name in streaming:
                continue  # (its frames: checked above, or as they are sent)
            try:
                checked[name] = check(inputs[name])
            except EntryTypeError as error:
                raise BadInputs(
                    f"graph `{graph}`: entry `{name}` is declared `{self.entry_types[graph][name]}` and {error}"
                ) from None
            except RecursionError:
                raise BadInputs(f"graph `{graph}`: entry `{name}` is nested too deeply to check") from None
        return program, checked

    def validate(self, graph: str, inputs: dict[str, Any], types: bool = True, fed: bool = False) -> GraphProgram:
        """The program of `graph` if `inputs` can call it (`fed`: start it, its streaming entries
        sent later); else UnknownGraph or BadInputs saying why."""
        program = self.programs.get(graph)
        if program is None:
            raise UnknownGraph(f"no graph `{graph}` in bundle `{self.bundle.name}`; it has {', '.join(self.programs)}")
        entry = (
            program.entry
            if not (fed and program.entry_stream)
            else tuple(e for e in program.entry if e not in program.entry_stream)
        )
        if isinstance(inputs, dict) and inputs.keys() == (program.entry_set if entry is program.entry else set(entry)):
            if types and self.entry_checks.get(graph):
                self.check_inputs(graph, inputs, fed)
            return program
        if not isinstance(inputs, Mapping):
            raise BadInputs(f"graph `{graph}` takes an object mapping {', '.join(entry)} to values, not {type(inputs).__name__}")
        missing = [e for e in entry if e not in inputs]
        extra = [k for k in inputs if k not in entry]
        guesses = [f"`{k}` for `{close[0]}`" for k in extra if (close := get_close_matches(str(k), missing, n=1))]
        sent = [f"`{k}`" for k in extra if fed and k in program.entry_stream]
        raise BadInputs(
            f"graph `{graph}` takes {', '.join(entry) or 'no entry value'}"
            + (f"; missing {', '.join(missing)}" if missing else "")
            + (f"; unexpected {', '.join(map(str, extra))}" if extra else "")
            + (f" (did you write {', '.join(guesses)}?)" if guesses else "")
            + (f" ({', '.join(sent)} streams: send its frames with `call.send`, then `call.end`)" if sent else "")
        )

    async def wait_idle(self) -> None:
        """Return once no call is running or queued."""
        if self.calls or self.scheduler.queues:
            waiter = asyncio.get_running_loop().create_future()
            self._idle_waiters.append(waiter)
            await waiter

    def statistics(self) -> dict[str, int]:
        """What the runtime holds now: `calls` running (with their tables summed), `queued_calls`
        waiting for their session's turn, `sessions` with a call running or queued or with state
        kept while idle (`idle_sessions`), and replicas running activations."""
        self.sessions.evict()
        totals: dict[str, int] = defaultdict(int)
        for call in self.calls:
            for key, value in call.statistics().items():
                totals[key] += value
        scheduled = self.scheduler.statistics()
        return {
            "calls": len(self.calls),
            **totals,
            "queued_calls": scheduled["queued_calls"],
            "sessions": scheduled["active_sessions"] + len(self.sessions.idle),
            "idle_sessions": len(self.sessions.idle),
            "busy_replicas": sum(b.busy_replicas() for b in self.bindings.values()),
            "thread_jobs": sum(t.running() for b in self.bindings.values() for t in b.threads),
        }
