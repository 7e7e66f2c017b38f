"""The language server behind editor support: `flowc lsp` (see docs/editors.md).

`server` speaks the protocol; `answers`, `index` and `positions` hold what it computes and
can be used without a client.
"""
