# Cython declarations for bucket.py (docs/runtime.md, "The compiled core").
from flowrt.control.program cimport GroupProgram

cdef Py_ssize_t PENDING, RECEIVED, UNREACHABLE

cdef class Bucket:
    cdef public GroupProgram group
    cdef public list state, values, reasons
    cdef public tuple roots
    cdef public object order, origin, reason
    cdef public bint closed

    cpdef Py_ssize_t arrived(self, Py_ssize_t slot, object value, tuple order) except -1
    cpdef Py_ssize_t ended(self, Py_ssize_t slot) except -1
    cpdef Py_ssize_t unreachable(self, Py_ssize_t slot, object reason, object origin) except -1
    cdef Py_ssize_t _decide(self) except -1
    cpdef bint received(self, Py_ssize_t slot) except -1
    cpdef object order_bound(self)
    cpdef dict inputs(self)
