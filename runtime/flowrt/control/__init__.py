"""flowrt's control flow: node tables executed by lookup, buckets, order, joins, completion.

The public names are re-exported here; the modules own one piece each (program, signals,
bucket, sequencer, roles, call, bounds, contract, impls, sessions, inputs, interrupts, runtime; and for a call
spread over processes: credit, envelopes, quiescence, shards). `COMPILED` says whether the
core runs compiled or from its Python sources, and `CORE` says why (flowrt.control.native).
"""

from flowrt.control import native

COMPILED, CORE = native.select()  # before the core's modules are imported

from flowrt.control.bucket import Bucket  # noqa: E402
from flowrt.control.call import Call  # noqa: E402
from flowrt.control.interrupts import Interrupted  # noqa: E402
from flowrt.control.roles import Context  # noqa: E402
from flowrt.control.runtime import (  # noqa: E402
    BadInputs,
    BadTimeout,
    CallHandle,
    FlowrtError,
    InputClosed,
    RoleError,
    Runtime,
    UnknownGraph,
)
from flowrt.control.sequencer import Sequencer  # noqa: E402
from flowrt.control.sessions import GCScheduler, SessionStore  # noqa: E402
from flowrt.control.signals import Reason  # noqa: E402

__all__ = [
    "COMPILED",
    "CORE",
    "BadInputs",
    "BadTimeout",
    "Bucket",
    "Call",
    "CallHandle",
    "Context",
    "FlowrtError",
    "GCScheduler",
    "InputClosed",
    "Interrupted",
    "Reason",
    "RoleError",
    "Runtime",
    "Sequencer",
    "SessionStore",
    "UnknownGraph",
]
