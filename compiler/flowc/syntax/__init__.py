"""The .flow syntax: grammar loading, the AST, and parsing with positioned syntax errors."""

from flowc.syntax.parser import ParseResult, parse

__all__ = ["ParseResult", "parse"]
