"""flowrt's control flow: node tables executed by lookup, buckets, order, joins, completion.

The public names are re-exported here; the modules own one piece each (program, signals,
bucket, sequencer, roles, call, runtime).
"""

from flowrt.control.bucket import Bucket
from flowrt.control.call import Call
from flowrt.control.roles import Context
from flowrt.control.runtime import BadInputs, FlowrtError, GCScheduler, Runtime, UnknownGraph
from flowrt.control.sequencer import Sequencer
from flowrt.control.signals import Reason

__all__ = [
    "BadInputs",
    "Bucket",
    "Call",
    "Context",
    "FlowrtError",
    "GCScheduler",
    "Reason",
    "Runtime",
    "Sequencer",
    "UnknownGraph",
]
