"""flowrt.observe: seeing a running pipeline. It owns the hooks the control core calls while a
graph runs (`hooks`), Prometheus metrics of calls and activations (`metrics`) and of the
deployment's processes (`deployment`: replicas, edges, pools, prefix reuse, from a snapshot the
deployment gathers), the Chrome trace of one call (`trace`; its lanes and payload counts in `tracelayout`, its
recorder and writer in C in `_tracewriter`, built from `_tracewriter.pyx`) and its picture as
SVG or HTML (`picture`).

It imports nothing of flowrt but values and flowrt.extensions (which C extensions may run): the control core calls its observers through the
hooks' five methods and knows nothing of this package; the gateway (GET /metrics,
`?trace=1`) and the command line (`flowc run --trace`, `flowc trace`) install and read them.
docs/observe.md is the guide.
"""

from flowrt.observe.hooks import Fanout, Observer, combine
from flowrt.observe.metrics import Metrics
from flowrt.observe.trace import CallTrace

__all__ = ["CallTrace", "Fanout", "Metrics", "Observer", "combine"]
