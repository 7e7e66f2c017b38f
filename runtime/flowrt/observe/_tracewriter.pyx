# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The C fast path of flowrt.observe.trace: recording an activation as it ends, and writing a
call's Chrome trace as JSON text straight into one growing C buffer.

flowrt.observe.trace is the specification: `Recorder.activation_ended` must append the very
tuple trace.Recorder appends, and `chrome_trace_json` must give text that decodes to the very
JSON value trace.chrome_trace_json gives (tests/observe/test_trace_writer.py holds them to it;
the bytes are equal too wherever msgspec writes a float as its decimal digits). What both lay
out the same way (lanes, names, the bytes of inputs) comes from flowrt.observe.tracelayout.
Times are written from whole nanoseconds as decimal microseconds, so no float is formatted.
setup.py compiles it with FLOWRT_SOURCE_DIGEST, the digest of its sources (flowrt.extensions).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memcpy
from os import getpid
from time import perf_counter

import dataclasses

import msgspec

from flowrt.observe import tracelayout
from flowrt.observe.hooks import outcome
from flowrt.observe.tracelayout import MAX_BYTES, NO_PAYLOAD, layout, replica_name


cdef extern from *:
    """
    #ifndef FLOWRT_SOURCE_DIGEST
    #define FLOWRT_SOURCE_DIGEST ""
    #endif
    """
    const char *FLOWRT_SOURCE_DIGEST

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object text, Py_ssize_t *size) except NULL
    long long PyLong_AsLongLongAndOverflow(object value, int *overflow) except? -1


SOURCE_DIGEST = (<bytes>FLOWRT_SOURCE_DIGEST).decode("ascii")  # "" when built without setup.py

cdef object CLOCK = perf_counter  # flowrt.observe.hooks.now
cdef object ENCODE = msgspec.json.encode
cdef frozenset NO_PAYLOAD_TYPES = NO_PAYLOAD
cdef dict REPLICA_NAMES = tracelayout._REPLICA_NAMES  # (the very cache tracelayout fills)
cdef object FIELDS = dataclasses.fields
cdef const char *HEX = "0123456789abcdef"


# ── recording ──

cdef class Recorder:
    """trace.Recorder in C: the same attributes, and the same tuple per ended activation."""

    cdef public object process, pid, call_id, graph, session, status
    cdef public double started, ended
    cdef public list activations

    def __init__(self, process="flowrt"):
        self.process = process
        self.pid = getpid()
        self.call_id = None
        self.graph = ""
        self.session = ""
        self.status = ""
        self.started = 0.0
        self.ended = 0.0
        self.activations = []

    def call_started(self, call):
        if self.call_id is None:
            self.call_id, self.graph, self.session = call.call_id, call.graph, call.session
            self.started = CLOCK()

    def activation_ended(self, call, act, reason):
        if call.call_id != self.call_id:
            return
        node = act.node
        inputs = act.inputs
        self.activations.append(
            (act.aid, node.role, node.method, act.replica, act.started, CLOCK(), act.sources, act.yielded, reason,
             payload_bytes(inputs) if inputs else 0)
        )

    def call_ended(self, call, status):
        if call.call_id == self.call_id:
            self.status = status
            self.ended = CLOCK()


cdef object payload_bytes(object inputs):
    """tracelayout.payload_bytes in C (never raising)."""
    total = 0
    try:
        for value in inputs.values():
            if type(value) not in NO_PAYLOAD_TYPES:
                for item in value if isinstance(value, list) else (value,):
                    if type(item) in NO_PAYLOAD_TYPES:
                        continue  # (no bytes, and not a dataclass: a list of token ids, say)
                    total += item_bytes(item)
                    if hasattr(type(item), "__dataclass_fields__") and not isinstance(item, type):  # is_dataclass
                        for field in FIELDS(item):
                            total += item_bytes(getattr(item, field.name, None))
    except Exception:
        pass
    return total


cdef object item_bytes(object item):
    try:
        if isinstance(item, (bytes, bytearray)):
            return len(item)
        if type(item) in NO_PAYLOAD_TYPES:
            return 0
        nbytes = item.nbytes if isinstance(item, memoryview) else getattr(item, "nbytes", None)
    except Exception:
        return 0
    return nbytes if isinstance(nbytes, int) and not isinstance(nbytes, bool) and 0 <= nbytes < MAX_BYTES else 0


# ── the text ──

cdef extern from "_tracetext.h":
    ctypedef struct Text "flowrt_text":
        char *data
        Py_ssize_t size
        Py_ssize_t capacity
    int put "flowrt_put"(Text *text, const char *chars, Py_ssize_t n) except -1
    int lit "flowrt_lit"(Text *text, const char *chars) except -1
    char *decimal "flowrt_decimal"(char *end, long long value) noexcept
    int put_int "flowrt_put_int"(Text *text, long long value) except -1
    int put_thousandths "flowrt_put_thousandths"(Text *text, long long value) except -1


cdef int put_escaped(Text *text, str value) except -1:
    """A str's characters as they go between a JSON string's quotes (msgspec's escapes)."""
    cdef Py_ssize_t size, i, run = 0
    cdef const char *chars = PyUnicode_AsUTF8AndSize(value, &size)
    cdef unsigned char c
    cdef char escape[6]
    for i in range(size):
        c = <unsigned char>chars[i]
        if c >= 0x20 and c != 34 and c != 92:
            continue
        put(text, chars + run, i - run)
        run = i + 1
        if c == 34:
            lit(text, "\\\"")
        elif c == 92:
            lit(text, "\\\\")
        elif c == 10:
            lit(text, "\\n")
        elif c == 13:
            lit(text, "\\r")
        elif c == 9:
            lit(text, "\\t")
        elif c == 8:
            lit(text, "\\b")
        elif c == 12:
            lit(text, "\\f")
        else:
            escape[0] = b'\\'
            escape[1] = b'u'
            escape[2] = b'0'
            escape[3] = b'0'
            escape[4] = HEX[c >> 4]
            escape[5] = HEX[c & 15]
            put(text, escape, 6)
    return put(text, chars + run, size - run)


cdef int put_str(Text *text, str value) except -1:
    lit(text, "\"")
    put_escaped(text, value)
    return lit(text, "\"")


cdef int put_value(Text *text, object value) except -1:
    """Any JSON value: str, int and None here; the rest as msgspec writes it."""
    cdef bytes encoded
    cdef int overflow = 0
    cdef long long number
    if type(value) is str:
        return put_str(text, value)
    if type(value) is int:
        number = PyLong_AsLongLongAndOverflow(value, &overflow)
        if not overflow:
            return put_int(text, number)
    if value is None:
        return lit(text, "null")
    encoded = ENCODE(value)
    return put(text, PyBytes_AS_STRING(encoded), PyBytes_GET_SIZE(encoded))


class Unwritable(Exception):
    """A trace this writer does not write exactly as trace.chrome_trace_json does; that
    function writes it instead (`chrome_trace_json`)."""


# whole nanoseconds (or thousandths of a µs) this writer writes: below 1e15 (11.5 days from the
# call's start) the decimal has at most 15 significant digits, which a double holds exactly, so
# msgspec writes the float spec's value with these very digits. Past it (an activation that never
# started, at 0.0, on a host up for weeks) the Python writer writes it.
cdef double LIMIT = 1e15


cdef inline long long nanoseconds(double seconds, double origin) except? -1:
    """trace._us: a time as whole nanoseconds since the call started (a time that is not
    finite, or centuries away, is Unwritable: a C cast of it would be undefined)."""
    cdef double offset = (seconds - origin) * 1e9
    if not (-LIMIT < offset < LIMIT):
        raise Unwritable()
    return <long long>offset


cdef inline long long duration(long long start, long long end) except? -1:
    """A duration in thousandths of a µs, rounded as trace.chrome_trace_json rounds it (from
    the two times in µs); never zero (zero would hide it)."""
    cdef double rounded = (end / 1e3 - start / 1e3) * 1e3 + 0.5
    if not (-LIMIT < rounded < LIMIT):
        raise Unwritable()
    return <long long>rounded if <long long>rounded != 0 else 1


cdef enum:
    FRAME_ID = 48  # room for "producer:index" between quotes, both 64-bit
    FEW = 48  # activations that lanes and sorts of their own handle; past that, Python's (n log n)


cdef struct Placed:
    Py_ssize_t record  # its index in trace.activations
    double start_s, end_s  # its start and end in seconds (start, then aid: the sort key)
    long long aid, start, end, tid  # (start and end in ns since the call started)
    Py_ssize_t lane  # its lane's index among the trace's distinct lanes (in the order they first appear)


cdef struct ByAid:
    long long aid
    Py_ssize_t index  # in `placed`


def chrome_trace_json(trace):
    """trace.chrome_trace_json in C: the JSON text of `trace`'s call. What this writer does
    not write exactly as that function does, that function writes: a str UTF-8 cannot encode,
    a time that is not finite, aids that are not distinct ints, records that are not tuples of
    ten (none of which a call's trace has)."""
    try:
        return write(trace)
    except (Unwritable, TypeError, ValueError, OverflowError):
        from flowrt.observe.trace import chrome_trace_json as specification

        return specification(trace)


def write_only(trace):
    """`chrome_trace_json` without handing anything over: Unwritable (or the error) instead.
    The tests hold it to the specification."""
    return write(trace)


cdef bytes write(trace):
    cdef Text text = Text(NULL, 0, 0)
    cdef list activations = list(trace.activations)  # (a copy: what a record's field runs cannot change it)
    cdef Py_ssize_t count = len(activations), i, arrows = 0, seen, frame_start
    cdef Placed *placed = <Placed *>malloc((count + 1) * sizeof(Placed))
    cdef ByAid *by_aid = <ByAid *>malloc((count + 1) * sizeof(ByAid))
    cdef long long *lane_tids = <long long *>malloc((count + 1) * sizeof(long long))
    cdef Placed *act
    cdef Placed *producer
    cdef double origin = trace.started
    cdef long long ended = nanoseconds(trace.ended, origin), leaves
    cdef char frame[FRAME_ID]
    if placed == NULL or by_aid == NULL or lane_tids == NULL:
        free(placed)
        free(by_aid)
        free(lane_tids)
        raise MemoryError()
    try:
        sort_by_start(activations, placed, count)
        distinct = lanes(activations, placed, count)
        lanes_of = lane_layout(trace.process, trace.pid, distinct)
        tids = lanes_of.tids
        for i in range(len(distinct)):
            lane_tids[i] = tids[distinct[i]]
        for i in range(count):
            act = &placed[i]
            act.start = nanoseconds(act.start_s, origin)
            act.end = nanoseconds(act.end_s, origin)
            act.tid = lane_tids[act.lane]
            by_aid[i] = ByAid(act.aid, i)
        placed[count] = Placed(-1, 0.0, 0.0, 0, 0, ended, 1, 0)
        by_aid[count] = ByAid(0, count)  # (the caller's entry values: a record's aid is never 0)
        index_by_aid(by_aid, count + 1)

        pid, call_id, session, graph = ENCODE(trace.pid), ENCODE(trace.call_id), ENCODE(trace.session), trace.graph
        graph_json = ENCODE(graph)
        call_fields = b"\"call_id\":" + call_id + b",\"graph\":" + graph_json + b",\"session\":" + session + \
            b",\"status\":" + ENCODE(trace.status)
        lane = b",\"pid\":" + pid + b",\"tid\":"  # what comes before an event's lane
        shared = b",\"process\":" + pid + b",\"call_id\":" + call_id + b",\"session\":" + session + b",\"graph\":" + \
            graph_json + b",\"aid\":"  # every activation's args but its own

        lit(&text, "{\"traceEvents\":[")
        put_bytes(&text, lanes_of.metadata_json)
        lit(&text, ",{\"name\":\"call ")
        put_escaped(&text, graph if type(graph) is str else f"{graph}")
        lit(&text, "\",\"cat\":\"call\",\"ts\":0.0,\"dur\":")
        put_thousandths(&text, max(duration(0, ended), 1))  # (trace._complete: at least 1 ns)
        put_bytes(&text, lane)
        lit(&text, "1,\"args\":{")
        put_bytes(&text, call_fields)
        lit(&text, "},\"ph\":\"X\"}")
        for i in range(count):
            act = &placed[i]
            aid, role, interface, replica, _, _, sources, frames, reason, input_bytes = activations[act.record]
            if type(sources) is not tuple:
                raise Unwritable()  # (the core's are; the specification reads any iterable once)
            lit(&text, ",{\"name\":\"")
            put_label(&text, role, interface)
            lit(&text, "\",\"cat\":\"activation\",\"ts\":")
            put_thousandths(&text, act.start)
            lit(&text, ",\"dur\":")
            put_thousandths(&text, duration(act.start, act.end))
            put_bytes(&text, lane)
            put_int(&text, act.tid)
            lit(&text, ",\"args\":{\"role\":")
            put_value(&text, role)
            lit(&text, ",\"interface\":")
            put_value(&text, interface)
            lit(&text, ",\"replica\":")
            put_value(&text, replica)
            put_bytes(&text, shared)
            put_value(&text, aid)
            lit(&text, ",\"inputs\":[")
            first = True
            for source, index in sources:
                if not first:
                    lit(&text, ",")
                first = False
                put_frame(&text, frame, frame_id(frame, source, index), source, index)
            lit(&text, "],\"frames\":")
            put_value(&text, frames)
            lit(&text, ",\"outcome\":")
            if reason is None:
                lit(&text, "\"ok\"")
            else:
                put_value(&text, outcome(reason))
            lit(&text, ",\"input_bytes\":")
            put_value(&text, input_bytes)
            lit(&text, "},\"ph\":\"X\"}")
            for source, index in sources:
                seen = producer_of(by_aid, count + 1, source)
                if seen < 0:
                    continue  # (a producer this trace did not see: none in one call)
                producer = &placed[seen]
                arrows += 1
                # the arrow leaves the producer while both run (a stream), else as it ends
                leaves = producer.start if act.start < producer.start else producer.end if act.start > producer.end else act.start
                frame_start = frame_id(frame, source, index)
                lit(&text, ",{\"ph\":\"s\"")
                arrow(&text, arrows, leaves, lane, producer.tid, frame, frame_start, source, index)
                lit(&text, ",{\"ph\":\"f\"")
                arrow(&text, arrows, act.start, lane, act.tid, frame, frame_start, source, index)
        lit(&text, "],\"displayTimeUnit\":\"ms\",\"otherData\":{")
        put_bytes(&text, call_fields)
        lit(&text, ",\"process\":")
        put_bytes(&text, pid)
        lit(&text, ",\"activations\":")
        put_int(&text, count)
        lit(&text, ",\"flowrt_trace\":1}}")
        return PyBytes_FromStringAndSize(text.data, text.size)
    finally:
        free(text.data)
        free(placed)
        free(by_aid)
        free(lane_tids)


cdef Py_ssize_t frame_id(char *out, object producer, object index) except -2:
    """A frame's id as a JSON string, "producer:index", at the end of `out` (FRAME_ID long);
    returns where it starts, or -1 where the two are not both machine integers (put_frame
    then writes it from Python)."""
    cdef int overflow = 0, overflow_index = 0
    cdef long long p, i
    cdef char *at
    if type(producer) is not int or type(index) is not int:
        return -1
    p = PyLong_AsLongLongAndOverflow(producer, &overflow)
    i = PyLong_AsLongLongAndOverflow(index, &overflow_index)
    if overflow or overflow_index:
        return -1
    at = out + FRAME_ID - 1
    at[0] = b'"'
    at = decimal(at, i) - 1
    at[0] = b':'
    at = decimal(at, p) - 1
    at[0] = b'"'
    return at - out


cdef int put_frame(Text *text, const char *frame, Py_ssize_t start, object producer, object index) except -1:
    if start >= 0:
        return put(text, frame + start, FRAME_ID - start)
    return put_str(text, f"{producer}:{index}")


cdef int arrow(Text *text, Py_ssize_t number, long long at, bytes lane, long long tid, const char *frame,
               Py_ssize_t frame_start, object producer, object index) except -1:
    """The rest of one end of a flow arrow, after its `{"ph":"s"` or `{"ph":"f"`."""
    lit(text, ",\"id\":")
    put_int(text, number)
    lit(text, ",\"ts\":")
    put_thousandths(text, at)
    put_bytes(text, lane)
    put_int(text, tid)
    lit(text, ",\"args\":{\"frame\":")
    put_frame(text, frame, frame_start, producer, index)
    return lit(text, "},\"name\":\"frame\",\"cat\":\"frame\",\"bp\":\"e\"}")


cdef int sort_by_start(list activations, Placed *placed, Py_ssize_t count) except -1:
    """`placed` as the records sorted by start, then aid (trace.START_THEN_AID): an insertion
    sort, as a call's activations mostly end in the order they started; Python's sort past
    FEW (an insertion sort's worst case is quadratic)."""
    cdef Py_ssize_t i, j
    cdef Placed entry
    for i in range(count):
        record = activations[i]
        if type(record) is not tuple or len(<tuple>record) != 10 or type(record[0]) is not int or record[0] == 0:
            raise Unwritable()  # (not a record; or an aid the writer would not tell from another's, or the caller's 0)
        entry = Placed(i, record[4], record[5], record[0], 0, 0, 0, 0)
        j = i
        if count > FEW:
            placed[i] = entry
            continue
        while j > 0 and (placed[j - 1].start_s > entry.start_s or
                         (placed[j - 1].start_s == entry.start_s and placed[j - 1].aid > entry.aid)):
            placed[j] = placed[j - 1]
            j -= 1
        placed[j] = entry
    if count > FEW:
        keyed = sorted([(placed[i].start_s, placed[i].aid, i) for i in range(count)])
        unsorted = <Placed *>malloc(count * sizeof(Placed))
        if unsorted == NULL:
            raise MemoryError()
        memcpy(unsorted, placed, count * sizeof(Placed))
        for j in range(count):
            placed[j] = unsorted[<Py_ssize_t>keyed[j][2]]
        free(unsorted)
    return 0


cdef list lanes(list activations, Placed *placed, Py_ssize_t count):
    """tracelayout.lanes over the records in `placed` order: the distinct lanes in the order
    they first appear, each record's index among them in its `lane`. Up to FEW records, with
    C arrays (a lane is its replica's first lane where that one is free at its start, else
    the next free one); past that, tracelayout.lanes itself."""
    cdef list distinct = []
    cdef list bases = []  # each distinct lane's replica
    cdef double free_at[FEW]  # when each distinct lane is free again
    cdef Py_ssize_t i, k, found, taken
    if count > FEW:
        return lanes_in_python(activations, placed, count)
    for i in range(count):
        record = activations[placed[i].record]
        role, replica = record[1], record[3]
        name = REPLICA_NAMES.get((role, replica))
        if name is None:
            name = replica_name(role, replica)
        found = -1
        taken = 0  # the replica's lanes seen so far
        for k in range(len(distinct)):
            if bases[k] == name:
                taken += 1
                if free_at[k] <= placed[i].start_s:
                    found = k
                    break
        if found < 0:
            found = len(distinct)
            bases.append(name)
            distinct.append(name if taken == 0 else f"{name} ({taken + 1})")
        free_at[found] = placed[i].end_s
        placed[i].lane = found
    return distinct


cdef list lanes_in_python(list activations, Placed *placed, Py_ssize_t count):
    cdef Py_ssize_t i
    names = tracelayout.lanes([activations[placed[i].record] for i in range(count)])
    index = {}
    for i in range(count):
        placed[i].lane = index.setdefault(names[i], len(index))
    return list(index)


cdef dict ORDERED_LAYOUTS = {}  # (process, pid, the lanes in the order they first appear) -> its Layout


cdef object lane_layout(object process, object pid, list distinct):
    """tracelayout.layout, by the lanes as a tuple, which is cheaper to make and hash than a set."""
    key = (process, pid, tuple(distinct))  # (as many keys as orders of a few lanes)
    made = ORDERED_LAYOUTS.get(key)
    if made is None:
        if len(ORDERED_LAYOUTS) >= 4096:
            ORDERED_LAYOUTS.clear()
        made = ORDERED_LAYOUTS[key] = layout(process, pid, frozenset(distinct))
    return made


cdef int index_by_aid(ByAid *by_aid, Py_ssize_t n) except -1:
    """`by_aid` sorted by aid (insertion sort up to FEW, qsort past it); two equal aids are
    Unwritable (the specification draws both with the last one's times)."""
    cdef Py_ssize_t i, j
    cdef ByAid entry
    if n > FEW:
        qsort(by_aid, n, sizeof(ByAid), compare_aids)
    else:
        for i in range(1, n):
            entry = by_aid[i]
            j = i
            while j > 0 and by_aid[j - 1].aid > entry.aid:
                by_aid[j] = by_aid[j - 1]
                j -= 1
            by_aid[j] = entry
    for i in range(1, n):
        if by_aid[i].aid == by_aid[i - 1].aid:
            raise Unwritable()
    return 0


cdef int compare_aids(const void *a, const void *b) noexcept nogil:
    cdef long long x = (<const ByAid *>a).aid, y = (<const ByAid *>b).aid
    return (x > y) - (x < y)


cdef Py_ssize_t producer_of(const ByAid *by_aid, Py_ssize_t n, object producer) except -2:
    """The index in `placed` of the activation whose aid is `producer` (-1: none); a producer
    that is not an int is Unwritable (the specification finds it by equality: 3.0 is 3)."""
    cdef int overflow = 0
    cdef long long aid
    cdef Py_ssize_t low = 0, high = n, middle
    if type(producer) is not int:
        raise Unwritable()
    aid = PyLong_AsLongLongAndOverflow(producer, &overflow)
    if overflow:
        return -1
    while low < high:
        middle = (low + high) // 2
        if by_aid[middle].aid < aid:
            low = middle + 1
        else:
            high = middle
    return by_aid[low].index if low < n and by_aid[low].aid == aid else -1


cdef inline int put_bytes(Text *text, bytes chunk) except -1:
    return put(text, PyBytes_AS_STRING(chunk), PyBytes_GET_SIZE(chunk))


cdef int put_label(Text *text, object role, object interface) except -1:
    """tracelayout.label between quotes: `role.interface`."""
    if type(role) is str and type(interface) is str:
        put_escaped(text, role)
        lit(text, ".")
        return put_escaped(text, interface)
    return put_escaped(text, f"{role}.{interface}")
