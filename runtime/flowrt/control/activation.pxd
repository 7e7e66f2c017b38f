# Cython declarations for activation.py (docs/runtime.md, "The compiled core").
from flowrt.control.program cimport NodeProgram

cdef class Activation:
    cdef public NodeProgram node
    cdef public Py_ssize_t group, aid, replica, yielded, children
    cdef public dict inputs
    cdef public tuple roots, extras, order, sources
    cdef public double started
    cdef public bint finished, pause
    cdef public Activation parent
    cdef public object resume

    cpdef object order_bound(self)
    cpdef wake(self)

cdef class Done:
    pass

cdef class NoTimeout:
    pass

cdef class Resume:
    cdef object awaitable, waiting

cdef class JoinState:
    cdef public dict values, frames
    cdef public bint fired
