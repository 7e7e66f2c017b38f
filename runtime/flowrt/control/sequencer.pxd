# Cython declarations for sequencer.py (docs/runtime.md, "The compiled core").

cdef class Sequencer:
    cdef public bint ordered, busy
    cdef public list held
    cdef public object fifo

    cpdef hold(self, object act, tuple order, Py_ssize_t ticket)
    cpdef object release(self, object bound)
    cpdef finished(self)
    cpdef Py_ssize_t waiting(self) except -1
