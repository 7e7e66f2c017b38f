# Cython declarations for program.py (docs/runtime.md, "The compiled core"): the types the
# compiled hot path reads at C speed. program.py stays the source; this file only adds types.
cimport cython

cdef class NodeProgram

cdef class GroupProgram:
    cdef public Py_ssize_t index, size
    cdef public tuple fields, stream_slots, slots_by_field
    cdef public bint single

cdef class Outlet:
    cdef public str consumer
    cdef public Py_ssize_t frames

cdef class Edge:
    cdef public Py_ssize_t kind
    cdef public str field
    cdef public NodeProgram node
    cdef public GroupProgram group
    cdef public Py_ssize_t slot, root, stream, index
    cdef public bint rule_c, ordered, returned
    cdef public Outlet outlet

    @cython.locals(root=Py_ssize_t)
    cdef tuple key(self, NodeProgram node, Py_ssize_t aid, tuple roots, Py_ssize_t yidx)

cdef class Route:
    cdef public str field
    cdef public tuple edges, absent

cdef class JoinField:
    cdef public str field
    cdef public object threshold
    cdef public tuple upstream

cdef class OrderConsumer:
    cdef public Py_ssize_t index, kind, target
    cdef public frozenset heap_nodes
    cdef public tuple session_resets, join_resets

cdef class NodeProgram:
    cdef public Py_ssize_t index
    cdef public str id, method
    cdef public object role, join, binding, timeout
    cdef public bint interface, session, ordered, stream, diamond_root, in_cycle, feeds_stream_slots, generator
    cdef public bint shared_outlets
    cdef public Py_ssize_t acts_started, acts_ended, acts_failed, acts_cancelled, frames_out
    cdef public tuple duration_bounds
    cdef public list duration_counts
    cdef public double duration_sum
    cdef public tuple groups, routes, join_watchers, order_feeds, bucket_feeds, reset_counters, ancestors, outlets
    cdef public frozenset carried, out_fields
    cdef public OrderConsumer consumer
    cdef public list methods

    @cython.locals(fields=frozenset)
    cdef bint plain(self, object frame) except -1
    @cython.locals(index=Py_ssize_t)
    cdef tuple out_roots(self, Py_ssize_t aid, tuple roots, Py_ssize_t yidx)

cdef class GraphProgram:
    cdef public str name
    cdef public tuple nodes, edges, entry, streams, returns, joins, consumers, stream_consumers, resets
    cdef public dict by_id, _stream_index
    cdef public frozenset entry_set
    cdef public tuple entry_stream
    cdef public dict entry_nodes
    cdef public NodeProgram start
    cdef public object timeout
    cdef public Py_ssize_t calls_started
    cdef public dict calls_ended
    cdef public tuple call_bounds
    cdef public list call_counts, first_counts
    cdef public double call_sum, first_sum
