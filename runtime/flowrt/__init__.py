"""flowrt: the runtime that generated flowc bundles import.

Serving nodes depend on this package only: it never imports the compiler, Lark or Jinja2.
The control plane (node controllers, buckets, sequence order), transport, registry, gateway
and data plane arrive in later releases; this package is importable so bundles can pin it.
"""

__version__ = "0.1.0"
