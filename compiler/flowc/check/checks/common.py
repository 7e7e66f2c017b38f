"""Helpers the checks share: finding repeated names and reporting them with the first one."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from flowc.diagnostics import Diagnostic, Note
from flowc.syntax import ast

T = TypeVar("T")


def repeats(items: Iterable[T], key: Callable[[T], object]) -> Iterator[tuple[T, T]]:
    """Each item whose key was seen before, with the first item of that key."""
    first: dict[object, T] = {}
    for item in items:
        k = key(item)
        if k in first:
            yield item, first[k]
        else:
            first[k] = item


def unique(items: Iterable[T], key: Callable[[T], object]) -> list[T]:
    """The first item of each key, in order."""
    seen: set[object] = set()
    return [i for i in items if not (key(i) in seen or seen.add(key(i)))]  # type: ignore[func-returns-value]


def repeated(code: str, message: str, repeat: ast.Ident, first: ast.Ident, hint: str, label: str = "first here") -> Diagnostic:
    return Diagnostic(code, message, repeat.span, hint, (Note(first.span, label),))


def text(ident: ast.Ident) -> str:
    return ident.text
