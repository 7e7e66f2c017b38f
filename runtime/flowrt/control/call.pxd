# Cython declarations for call.py (docs/runtime.md, "The compiled core"): the hot path's types.
# call.py is the source and runs as it is where the core is not compiled.
cimport cython

from flowrt.control.bucket cimport Bucket
from flowrt.control.program cimport Edge, GraphProgram, GroupProgram, JoinField, NodeProgram, OrderConsumer, Route
from flowrt.control.roles cimport RoleBinding
from flowrt.control.sequencer cimport Sequencer

cdef Py_ssize_t CALLER, DIRECT, JOIN, STREAM_SLOT, WAITING, FIRED, ORDERED_STREAM, PAUSE_EVERY, OUTBOX_HIGH, CHILDREN_HIGH
cdef object EMPTY, ERROR, CANCEL
cdef _Done DONE
cdef _NoTimeout NO_TIMEOUT

cdef class Activation:
    cdef public NodeProgram node
    cdef public Py_ssize_t group, aid, replica, yielded, children
    cdef public dict inputs
    cdef public tuple roots, extras, order
    cdef public bint finished, pause
    cdef public Activation parent
    cdef public object resume

    cpdef object order_bound(self)

cdef class _Done:
    pass

cdef class _NoTimeout:
    pass

cdef class _Resume:
    cdef object awaitable, waiting

cdef class JoinState:
    cdef public dict values
    cdef public bint fired

cdef class Call:
    cdef public object runtime, inputs, session, outbox, waiter, end_waiters, loop
    cdef public GraphProgram program
    cdef public str graph
    cdef public Py_ssize_t call_id, in_flight, running, eager_depth, last_aid, tickets
    cdef public list errors, open_buckets, running_by_node, session_counters, ready, stream_held, order_heaps, alive
    cdef public dict buckets, joins, sequencers
    cdef public set resolved, joins_done, seen_unreachable, tasks, returned, errored, order_waiting
    cdef public Activation producer
    cdef public list outbox_waiters
    cdef public bint cancelled, ended, custom_tasks
    cdef public str cancel_reason

    cpdef start(self)
    cdef Py_ssize_t _aid(self)
    cdef Py_ssize_t _ticket(self)
    @cython.locals(join=NodeProgram, sequencer=Sequencer, reset=Py_ssize_t, parent=Activation)
    cdef _activation_done(self, NodeProgram node, Activation act)
    @cython.locals(join=NodeProgram)
    cdef _quiesce(self)
    @cython.locals(running=list, buckets=list, nodes=tuple, index=Py_ssize_t, upstream=NodeProgram)
    cdef bint _fed(self, NodeProgram join) except -1
    cdef _unblock(self)
    cdef _finish(self)
    cpdef cancel(self, str reason=*)
    @cython.locals(bucket=Bucket, outcome=Py_ssize_t, consumer=OrderConsumer)
    cdef _arrive(self, Edge edge, tuple key, object value, tuple roots, tuple order)
    @cython.locals(bucket=Bucket, outcome=Py_ssize_t)
    cdef _end(self, Edge edge, tuple key)
    @cython.locals(kind=Py_ssize_t, node=NodeProgram, group=GroupProgram, bucket=Bucket, outcome=Py_ssize_t)
    cdef _unreachable(self, Edge edge, tuple key, tuple roots, object reason, object origin)
    @cython.locals(bucket=Bucket, node=NodeProgram, reset=Py_ssize_t)
    cdef Bucket _bucket(self, Edge edge, tuple bucket_key, tuple roots)
    @cython.locals(node=NodeProgram, reset=Py_ssize_t)
    cdef _close_bucket(self, Edge edge, tuple bucket_key, Bucket bucket, Py_ssize_t outcome)
    @cython.locals(aid=Py_ssize_t)
    cdef _dead(self, NodeProgram node, tuple roots, object reason, object origin)
    @cython.locals(state=JoinState)
    cdef _join_arrived(self, NodeProgram node, str name, object value)
    @cython.locals(state=JoinState, j=JoinField)
    cdef bint _try_join(self, NodeProgram node, bint final) except -1
    @cython.locals(reset=Py_ssize_t)
    cdef _join_resolved(self, NodeProgram node)
    @cython.locals(join=JoinField, running=list, buckets=list)
    cdef bint _all_fields_ended(self, NodeProgram node) except -1
    @cython.locals(node=NodeProgram, sequencer=Sequencer, consumer=OrderConsumer, reset=Py_ssize_t, producer=Activation)
    cdef _schedule(self, Activation act)
    cdef _spawn(self, object act)
    cdef _launch(self)
    @cython.locals(ready=list, act=Activation)
    cdef Activation _next_ready(self)
    cdef _start_task(self, Activation act)
    cdef _error(self, NodeProgram node, str message, str where=*)
    @cython.locals(node=NodeProgram, binding=RoleBinding)
    cdef object _begin(self, Activation act)
    @cython.locals(binding=RoleBinding)
    cdef _finished(self, Activation act)
    @cython.locals(node=NodeProgram, yielded=Py_ssize_t)
    cdef _yielded(self, Activation act, object frame, dict streams)
    cdef _returned(self, Activation act, object frame, dict streams)
    cpdef taken(self)
    cdef _role_failed(self, Activation act, object error, object result)
    @cython.locals(out=Py_ssize_t)
    cdef tuple _out_order(self, NodeProgram node, tuple order, Py_ssize_t yidx)
    @cython.locals(node=NodeProgram, route=Route, edge=Edge, kind=Py_ssize_t, order=tuple, key=tuple, roots=tuple, opened=tuple)
    cdef _dispatch_frame(self, Activation act, dict frame, Py_ssize_t yidx, dict streams)
    @cython.locals(route=Route, edge=Edge, out_roots=tuple)
    cdef _dispatch_phantom(self, NodeProgram node, Py_ssize_t aid, tuple roots, object reason, tuple origin)
    @cython.locals(edge=Edge, key=tuple, roots=tuple)
    cdef _end_streams(self, Activation act, dict streams, object reason)
    cdef _emit(self, object event)
    @cython.locals(stream=Py_ssize_t, consumer=OrderConsumer, held=list)
    cdef _caller_arrived(self, Edge edge, object value, tuple order)
    @cython.locals(done=set, counters=list, resets=tuple, reset=Py_ssize_t, heap=list, entry=tuple)
    cdef object _lower_bound(self, OrderConsumer consumer)
    @cython.locals(consumer=OrderConsumer)
    cdef _reorder(self)
    cdef _hold(self, OrderConsumer consumer, list held, tuple order, object value)
    @cython.locals(held=list)
    cdef _release_stream(self, OrderConsumer consumer)
    @cython.locals(sequencer=Sequencer)
    cdef _release_session(self, OrderConsumer consumer)

cdef tuple _first_step(object awaitable)
cdef _wake(Activation act)
@cython.locals(fields=frozenset)
cdef dict _as_frame(object frame, NodeProgram node)
cdef tuple _out_roots(NodeProgram node, Py_ssize_t aid, tuple roots, Py_ssize_t yidx)
@cython.locals(root=Py_ssize_t)
cdef tuple _key(NodeProgram node, Py_ssize_t aid, Edge edge, tuple roots, Py_ssize_t yidx)
@cython.locals(join=JoinField)
cdef bint _counts_met(NodeProgram node, JoinState state) except -1
