"""What makes an `impl "package.module:Class"` string valid, and what to say when it is not.

A module path and a class path are dotted Python identifiers, Unicode ones included (`prøbe`,
`Échø` are valid Python and import fine). Python reads identifiers in NFKC form, so an impl is
taken only in that form: `getattr(module, "ﬁle")` would not find a class written `ﬁle` in the
source, which Python stores as `file`. Each problem names the offending part and its fix.
"""

from __future__ import annotations

import keyword
import unicodedata


def impl_problem(impl: str) -> tuple[str, str] | None:
    """(what is wrong, how to fix it), or None when `impl` is a valid "module:Class"."""
    module, colon, cls = impl.partition(":")
    if not colon:
        if "." in impl.strip("."):
            head, _, tail = impl.rpartition(".")
            return "it has no `:` between the module and the class", f'write "{head}:{tail}": the module path, `:`, the class'
        return "it names no module", f'write "module:{impl}", naming the Python module that defines `{impl}`'
    if ":" in cls:
        return "it has more than one `:`", "use one `:`, between the module path and the class name"
    if not module:
        return "the module is missing before the `:`", f'write "package.module:{cls}"'
    if not cls:
        return "the class is missing after the `:`", f'write "{module}:ClassName"'
    for what, path in (("module path", module), ("class name", cls)):
        problem = _dotted_problem(what, path)
        if problem is not None:
            return problem
    return None


def _dotted_problem(what: str, path: str) -> tuple[str, str] | None:
    if path != path.strip():
        return f"the {what} `{path}` has spaces around it", f"remove the spaces: `{path.strip()}`"
    for part in path.split("."):
        if not part:
            return f"the {what} `{path}` has an empty part", "write the names separated by single dots, with none at either end"
        normal = unicodedata.normalize("NFKC", part)
        if normal != part and normal.isidentifier():
            return (
                f"`{part}` in the {what} is not in the form Python reads identifiers in (NFKC)",
                f"write it as `{normal}`, the name Python gives it",
            )
        if not part.isidentifier():
            return f"`{part}` in the {what} is not a Python identifier", _identifier_hint(part)
        if keyword.iskeyword(part):
            return (
                f"`{part}` in the {what} is a Python keyword",
                f"rename the {'module' if what == 'module path' else 'class'}: `{part}` cannot be imported by that name",
            )
    return None


def _identifier_hint(part: str) -> str:
    if part[0].isdigit():
        return f"a Python name cannot start with a digit: rename `{part}`"
    bad = next(c for c in part if not ("a" + c).isidentifier())
    if bad == "-":
        return f"a Python name cannot hold `-`: write `{part.replace('-', '_')}`, and rename the file or class to match"
    if bad.isspace():
        shown = "spaces"
    elif bad.isprintable():
        shown = f"`{bad}`"
    else:
        shown = f"the invisible character U+{ord(bad):04X}"
    return f"a Python name holds letters, digits and `_`, not {shown}: rename `{part}`"
