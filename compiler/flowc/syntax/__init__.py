"""The .flow syntax: grammar loading, the AST, and parsing with positioned syntax errors."""

from flowc.syntax.parser import ParseResult, keywords, parse

__all__ = ["ParseResult", "keywords", "parse"]
