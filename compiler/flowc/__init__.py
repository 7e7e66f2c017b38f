"""flowc: the compiler for .flow multimodal inference pipelines.

The front end lives in `flowc.syntax` (grammar, AST, parser) and `flowc.check` (resolution and
checks); `flowc.fmt` prints the canonical form and `flowc.cli` is the command line.
"""

__version__ = "0.1.0"
