"""flowrt.gateway: HTTP in front of a runtime (any `--deploy`): the graph endpoint, /graphs,
/health and /stats (flowrt.gateway.http), and the OpenAI-compatible chat endpoint under /v1
(flowrt.gateway.openai, docs/openai.md). It imports the control core's embedding API (and
values, options, errors), never the deployment that runs the roles: a deployment's own
statistics reach /stats through the object `application` is given.
"""

from flowrt.gateway.http import application, event_lines, parse_address

__all__ = ["application", "event_lines", "parse_address"]
