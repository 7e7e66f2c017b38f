"""flowrt's control flow: node tables executed by lookup, buckets, order, joins, completion.

The public names are re-exported here; the modules own one piece each (signals, bucket,
sequencer, call, runtime).
"""

from flowrt.control.bucket import Bucket, Outcome
from flowrt.control.call import Call
from flowrt.control.runtime import BadInputs, Context, FlowrtError, GCScheduler, Runtime, UnknownGraph
from flowrt.control.sequencer import Sequencer
from flowrt.control.signals import Kind, Reason, Signal

__all__ = [
    "BadInputs",
    "Bucket",
    "Call",
    "Context",
    "FlowrtError",
    "GCScheduler",
    "Kind",
    "Outcome",
    "Reason",
    "Runtime",
    "Sequencer",
    "Signal",
    "UnknownGraph",
]
