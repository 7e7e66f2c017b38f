# Cython declarations for delivery.py (docs/runtime.md, "The compiled core"): the call's state
# and its signal, bucket, join, caller and order methods; the methods its subclass Call
# implements are declared here too, so this half calls them through the vtable.
cimport cython

from flowrt.control.activation cimport Activation, JoinState
from flowrt.control.bucket cimport Bucket
from flowrt.control.program cimport Edge, GraphProgram, GroupProgram, JoinField, NodeProgram, OrderConsumer
from flowrt.control.sequencer cimport Sequencer

cdef Py_ssize_t CALLER, DIRECT, JOIN, WAITING, FIRED, ORDERED_STREAM
cdef object EMPTY, ERROR, CANCEL, CLOCK

@cython.locals(join=JoinField)
cdef double _threshold(NodeProgram node, str name) except -1

cdef class Delivery:
    cdef public object runtime, inputs, session, outbox, waiter, end_waiters, loop, observer, router, aid_source
    cdef public tuple sending
    cdef public Py_ssize_t sending_from, sending_index
    cdef public dict arrivals, entries
    cdef public GraphProgram program
    cdef public str graph
    cdef public Py_ssize_t call_id, in_flight, running, phantoms, eager_depth, last_aid, tickets
    cdef public list errors, open_buckets, running_by_node, session_counters, ready, stream_held, order_heaps, alive
    cdef public dict buckets, joins, sequencers
    cdef public set resolved, joins_done, seen_unreachable, tasks, returned, errored, order_waiting
    cdef public Activation producer
    cdef public list outbox_waiters
    cdef public bint cancelled, failed, ended, custom_tasks, track_frames, watch_output, hear_first_output
    cdef public bint watch_starts, watch_ends
    cdef public double started
    cdef public str cancel_reason

    cdef tuple _sent(self)
    cdef Py_ssize_t _aid(self)
    cdef Py_ssize_t _ticket(self)
    @cython.locals(bucket=Bucket, outcome=Py_ssize_t, consumer=OrderConsumer)
    cdef _arrive(self, Edge edge, tuple key, object value, tuple roots, tuple order)
    @cython.locals(bucket=Bucket, outcome=Py_ssize_t)
    cdef _end(self, Edge edge, tuple key)
    @cython.locals(kind=Py_ssize_t, node=NodeProgram, group=GroupProgram, bucket=Bucket, outcome=Py_ssize_t)
    cdef _unreachable(self, Edge edge, tuple key, tuple roots, object reason, object origin)
    @cython.locals(bucket=Bucket, node=NodeProgram, reset=Py_ssize_t)
    cdef Bucket _bucket(self, Edge edge, tuple bucket_key, tuple roots)
    @cython.locals(node=NodeProgram, reset=Py_ssize_t, act=Activation)
    cdef _close_bucket(self, Edge edge, tuple bucket_key, Bucket bucket, Py_ssize_t outcome)
    @cython.locals(aid=Py_ssize_t)
    cdef _dead(self, NodeProgram node, tuple roots, object reason, object origin)
    @cython.locals(state=JoinState, frames=list)
    cdef _join_arrived(self, NodeProgram node, str name, object value)
    @cython.locals(state=JoinState, j=JoinField, act=Activation)
    cdef bint _try_join(self, NodeProgram node, bint final) except -1
    @cython.locals(reset=Py_ssize_t)
    cdef _join_resolved(self, NodeProgram node)
    @cython.locals(join=JoinField, running=list, buckets=list)
    cdef bint _all_fields_ended(self, NodeProgram node) except -1
    @cython.locals(program=GraphProgram, seconds=double)
    cdef _emit(self, object event)
    @cython.locals(stream=Py_ssize_t, consumer=OrderConsumer, held=list)
    cdef _caller_arrived(self, Edge edge, object value, tuple order)
    @cython.locals(done=set, counters=list, resets=tuple, reset=Py_ssize_t)
    cdef object _lower_bound(self, OrderConsumer consumer)
    @cython.locals(heap=list, entry=tuple)
    cpdef object heap_bound(self, OrderConsumer consumer)
    cpdef remote_arrive(self, Edge edge, tuple key, object value, tuple roots, tuple order)
    cpdef remote_end(self, Edge edge, tuple key)
    cpdef remote_unreachable(self, Edge edge, tuple key, tuple roots, object reason, object origin)
    cpdef remote_join(self, NodeProgram node, str name, object value)
    cpdef remote_direct(self, Edge edge, object value, tuple roots, tuple order)
    cpdef remote_caller(self, Edge edge, object value, tuple order)
    cpdef remote_resolve(self, NodeProgram node)
    cpdef remote_release(self, OrderConsumer consumer)
    @cython.locals(consumer=OrderConsumer)
    cdef _reorder(self)
    cdef _hold(self, OrderConsumer consumer, list held, tuple order, object value)
    @cython.locals(held=list)
    cdef _release_stream(self, OrderConsumer consumer)
    @cython.locals(sequencer=Sequencer)
    cdef _release_session(self, OrderConsumer consumer)
    cdef _call_began(self)
    @cython.locals(program=GraphProgram, ended=dict, seconds=double)
    cdef _call_ending(self, str status)
    @cython.locals(node=NodeProgram)
    cdef _act_started(self, Activation act)
    @cython.locals(node=NodeProgram, seconds=double)
    cdef _act_ended(self, Activation act, object reason)
    cdef _activation_done(self, NodeProgram node, Activation act)
    cdef _schedule(self, Activation act)
    cdef _spawn(self, object act)
    cdef _dispatch_phantom(self, NodeProgram node, Py_ssize_t aid, tuple roots, object reason, tuple origin)

cdef tuple _consumed(Bucket bucket, dict frames)
@cython.locals(join=JoinField)
cdef bint counts_met(NodeProgram node, JoinState state) except -1
@cython.locals(n=Py_ssize_t, i=Py_ssize_t, bound=double)
cdef _histogram_add(list counts, tuple bounds, double seconds)
