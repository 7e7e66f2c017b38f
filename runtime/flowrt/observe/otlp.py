"""Every call as OpenTelemetry spans, sent over OTLP where the standard SDK is installed
(`pip install 'flowc[otlp]'`): a span per call, and under it a span per activation with the
same facts a Chrome trace has (role, interface, replica, aid, consumed frame ids, frames out,
input bytes, outcome) and the ids logs and error events carry (`flowrt.call_id`,
`flowrt.session`).

A server turns it on by the SDK's own settings: `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set, and `OTEL_SDK_DISABLED` not true (`from_environment`).
The exporter, its protocol (OTLP over HTTP, protobuf), its batching and `OTEL_SERVICE_NAME`
are the SDK's; flowrt only turns its calls into spans. Spans are made when a call ends, from
times the hooks kept, and handed to the SDK's batch processor, which sends them from its own
thread: a call does not wait on the collector, and a collector that is down costs the SDK's
retries, not the call.

It imports nothing of flowrt but the observer hooks and the trace's payload counting; the
OpenTelemetry packages are imported only when the export is made.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import urllib.parse
from typing import Any

from flowrt.observe.hooks import Observer, now, outcome
from flowrt.observe.trace import payload_bytes

log = logging.getLogger("flowrt.observe")

ENDPOINT_SETTINGS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
INSTALL = "pip install 'flowc[otlp]'"
SHUTDOWN_WAIT = 2.0  # seconds a stopping server gives the collector for the spans still queued


class OtlpExport(Observer):
    """An observer that turns each call it hears of into spans on `provider` (an SDK
    TracerProvider); `shutdown()` sends what is still queued."""

    frames = True  # each activation's consumed frames become its `flowrt.inputs`

    def __init__(self, provider: Any, service: str = "flowrt") -> None:
        from opentelemetry import trace

        self.provider = provider
        self.tracer = provider.get_tracer("flowrt", schema_url=None)
        self._trace = trace
        self._calls: dict[Any, tuple[float, list[tuple]]] = {}  # call id -> (start, ended activations)
        # the hooks' clock is monotonic; spans want nanoseconds since the epoch
        self._epoch_offset = time.time_ns() - int(now() * 1e9)
        self.spans = 0  # spans handed to the SDK (statistics)

    def call_started(self, call: Any) -> None:
        self._calls[call.call_id] = (now(), [])

    def activation_started(self, call: Any, act: Any) -> None:
        if act.started == 0.0:
            act.started = now()

    def activation_ended(self, call: Any, act: Any, reason: Any) -> None:
        kept = self._calls.get(call.call_id)
        if kept is not None:
            inputs = act.inputs
            kept[1].append(
                (act.aid, act.node.role, act.node.method, act.replica, act.started, now(), act.sources, act.yielded,
                 reason, payload_bytes(inputs) if inputs else 0)
            )  # fmt: skip

    def call_ended(self, call: Any, status: str) -> None:
        kept = self._calls.pop(call.call_id, None)
        if kept is None:
            return
        try:
            self._export(call, status, *kept)
        except Exception:  # noqa: BLE001 - a hook must not raise: a bad span loses the span, never the call
            log.exception("flowrt: could not make the OpenTelemetry spans of call %s", call.call_id)

    def _export(self, call: Any, status: str, started: float, activations: list[tuple]) -> None:
        from opentelemetry.trace import Status, StatusCode

        # the call id as traces and logs write it (an integer); a session-less call has ""
        ids = {"flowrt.call_id": call.call_id, "flowrt.session": str(call.session or ""), "flowrt.graph": call.graph}
        root = self.tracer.start_span(
            f"call {call.graph}", start_time=self._ns(started), attributes={**ids, "flowrt.status": status}
        )
        if status != "ok":
            root.set_status(Status(StatusCode.ERROR, status))
        parent = self._trace.set_span_in_context(root)
        for aid, role, interface, replica, start, end, sources, frames, reason, input_bytes in activations:
            ended = outcome(reason)
            span = self.tracer.start_span(
                f"{role}.{interface}",
                context=parent,
                start_time=self._ns(start),
                attributes={
                    **ids,
                    "flowrt.role": role,
                    "flowrt.interface": interface,
                    "flowrt.replica": replica,
                    "flowrt.aid": aid,
                    "flowrt.inputs": [f"{producer}:{index}" for producer, index in sources],
                    "flowrt.frames": frames,
                    "flowrt.input_bytes": input_bytes,
                    "flowrt.outcome": ended,
                },
            )
            if ended != "ok":
                span.set_status(Status(StatusCode.ERROR, ended))
            span.end(end_time=self._ns(end))
        root.end(end_time=self._ns(now()))
        self.spans += len(activations) + 1

    def _ns(self, seconds: float) -> int:
        return int(seconds * 1e9) + self._epoch_offset

    def statistics(self) -> dict:
        return {"calls_open": len(self._calls), "spans": self.spans}

    def shutdown(self, wait: float = SHUTDOWN_WAIT) -> None:
        """Send the spans still queued and stop the SDK's exporter thread, waiting at most
        `wait` seconds: a collector that is down or slow delays a server's stop that long, no
        longer (its spans are then dropped, and the log says so)."""
        stopping = threading.Thread(target=self.provider.shutdown, name="flowrt-otlp-shutdown", daemon=True)
        stopping.start()
        stopping.join(wait)
        if stopping.is_alive():
            log.warning(
                "flowrt: the OTLP collector did not take the last spans within %.0f s; they are dropped "
                "(check OTEL_EXPORTER_OTLP_ENDPOINT)",
                wait,
            )


def wanted() -> bool:
    """Whether the environment asks for OTLP export (the SDK's own settings)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(os.environ.get(name, "").strip() for name in ENDPOINT_SETTINGS)


class OtlpUnavailable(RuntimeError):
    """OTLP export is asked for and the OpenTelemetry SDK is not installed."""


def check() -> None:
    """OtlpUnavailable (naming the setting and the fix) where the environment asks for OTLP
    export and the SDK cannot be imported, or the endpoint is not an http(s) URL; what a
    server checks before it starts."""
    if not wanted():
        return
    for setting in ENDPOINT_SETTINGS:
        endpoint = os.environ.get(setting, "").strip()
        if endpoint and not _http_url(endpoint):
            raise OtlpUnavailable(
                f"{setting}={endpoint!r} is not an http(s) URL; give the collector's OTLP/HTTP address, "
                "e.g. http://127.0.0.1:4318, or unset it"
            )
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as error:
        setting = next(name for name in ENDPOINT_SETTINGS if os.environ.get(name, "").strip())
        raise OtlpUnavailable(
            f"{setting} is set, but the OpenTelemetry SDK is not installed ({error.name} is missing); "
            f"install it with `{INSTALL}`, or unset {setting}"
        ) from None


def _http_url(text: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and " " not in text


def from_environment(service: str = "flowrt") -> OtlpExport | None:
    """An export configured by the OTEL_* settings, or None where none is asked for
    (OtlpUnavailable where one is and the SDK is missing)."""
    if not wanted():
        return None
    check()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # shutdown_on_exit off: `shutdown` bounds the wait; the SDK's own at-exit hook would wait on a
    # dead collector again, for its full timeout and retries
    provider = TracerProvider(
        resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service)}), shutdown_on_exit=False
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return OtlpExport(provider, service)
