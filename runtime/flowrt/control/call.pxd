# Cython declarations for call.py (docs/runtime.md, "The compiled core"): the hot path's types.
# call.py is the source and runs as it is where the core is not compiled.
cimport cython

from flowrt.control.activation cimport Activation, NoTimeout, Resume
from flowrt.control.delivery cimport Delivery
from flowrt.control.program cimport Edge, NodeProgram, OrderConsumer, Outlet, Route
from flowrt.control.roles cimport RoleBinding
from flowrt.control.sequencer cimport Sequencer

cdef Py_ssize_t CALLER, DIRECT, JOIN, STREAM_SLOT, PAUSE_EVERY, OUTBOX_HIGH, CHILDREN_HIGH
cdef object EMPTY, ERROR, CANCEL
cdef NoTimeout NO_TIMEOUT
cdef tuple ENTRY_FRAMES

cdef class Call(Delivery):
    cpdef start(self)
    @cython.locals(join=NodeProgram, sequencer=Sequencer, reset=Py_ssize_t, parent=Activation)
    cdef _activation_done(self, NodeProgram node, Activation act)
    @cython.locals(join=NodeProgram)
    cdef _quiesce(self)
    @cython.locals(running=list, buckets=list, nodes=tuple, index=Py_ssize_t, upstream=NodeProgram)
    cdef bint _fed(self, NodeProgram join) except -1
    cdef _unblock(self)
    cdef _finish(self)
    cpdef cancel(self, str reason=*)
    cpdef fail(self, str message, str where)
    @cython.locals(
        node=NodeProgram, sequencer=Sequencer, consumer=OrderConsumer, reset=Py_ssize_t, producer=Activation, sending=tuple,
        sending_from=Py_ssize_t, sending_index=Py_ssize_t
    )
    cdef _schedule(self, Activation act)
    cdef _spawn(self, object act)
    cdef _launch(self)
    cpdef launch_ready(self)
    cpdef finish_call(self)
    @cython.locals(node=NodeProgram)
    cdef _conclude(self, Activation act, object reason, dict streams)
    @cython.locals(node=NodeProgram, act=Activation, consumer=OrderConsumer, reset=Py_ssize_t, roots=tuple)
    cdef _open_entries(self, Activation start)
    @cython.locals(act=Activation, streams=dict)
    cpdef entry_frame(self, str name, object value)
    @cython.locals(act=Activation, streams=dict)
    cpdef entry_end(self, str name, object reason=*)
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
    @cython.locals(act=Activation)
    cpdef taken(self)
    cdef _role_failed(self, Activation act, object error, object result)
    cdef tuple _out_order(self, NodeProgram node, tuple order, Py_ssize_t yidx)
    @cython.locals(
        node=NodeProgram, route=Route, edge=Edge, kind=Py_ssize_t, order=tuple, key=tuple, roots=tuple, opened=tuple,
        direct=Activation, outlet=Outlet, shared=bint, counted=list,
    )
    cdef _dispatch_frame(self, Activation act, dict frame, Py_ssize_t yidx, dict streams)
    @cython.locals(route=Route, edge=Edge, out_roots=tuple)
    cdef _dispatch_phantom(self, NodeProgram node, Py_ssize_t aid, tuple roots, object reason, tuple origin)
    @cython.locals(edge=Edge, key=tuple, roots=tuple)
    cdef _end_streams(self, Activation act, dict streams, object reason)

cdef tuple _first_step(object awaitable)
