# Cython declarations for roles.py (docs/runtime.md, "The compiled core").
from flowrt.control.program cimport NodeProgram

cdef Py_ssize_t BROADCAST
cdef object NO_GLOBALS

cdef class Context:
    cdef public object session, call_id, graph, role, interface, globals, logger, replica, memory

cdef class RoleBinding:
    cdef public str name, lb
    cdef public bint broadcast
    cdef public tuple uses
    cdef public list instances, load, threads
    cdef public Py_ssize_t count, rr
    cdef public object globals, log, memory

    cpdef Py_ssize_t replica(self, str session) except -1
    cpdef tuple begin(self, NodeProgram node, str session, object call_id, str graph, dict inputs)
    cpdef finished(self, Py_ssize_t replica, tuple extras)
