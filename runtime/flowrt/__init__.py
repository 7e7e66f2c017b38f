"""flowrt: the runtime that generated flowc bundles import.

Serving nodes depend on this package only: it never imports the compiler, Lark or Jinja2.
What roles may use from it directly: `BadInput`, the error a role raises for a request the
caller must fix (the gateway answers it 400; docs/runtime.md, "Roles").
"""

from flowrt.errors import BadInput

__version__ = "0.1.0"

__all__ = ["BadInput", "__version__"]
