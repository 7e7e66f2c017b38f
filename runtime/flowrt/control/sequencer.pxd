# Cython declarations for sequencer.py (docs/runtime.md, "The compiled core").

cdef class Sequencer:
    cdef public Py_ssize_t groups, expected
    cdef public bint ordered, busy
    cdef public dict pending, settled
    cdef public set done_ahead
    cdef public object fifo

    cpdef object ready(self, Py_ssize_t seq, object act)
    cpdef object settle(self, Py_ssize_t seq, Py_ssize_t group, bint ran)
    cdef object _advance(self)
    cdef _next(self)
    cpdef object release_stalled(self)
