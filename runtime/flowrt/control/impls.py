"""The user's role implementations, loaded and checked when the runtime opens.

A role's `impl "module:Class"` is imported, its class constructed (once per replica, without
arguments) and held to the interfaces the .flow file declares before any call runs: every
interface is an `async def` or an async generator (run on the event loop) or a plain `def` or
generator (run on the replica's worker thread: flowrt.control.threads), takes `ctx` and then
every field of each input group that can fire it as a keyword (OR groups pass only their own
fields, so the others need defaults; `**fields` takes them all), and `setup`, if any, returns.
A role that breaks one of these fails the open with a `RoleError` naming the role, the place
in the user's code and the fix, instead of failing calls later (or a traceback).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flowrt.errors import RoleError, place, shown
from flowrt.tables import RoleSpec


def _at(where: str) -> str:
    return f" at {where}" if where else ""


def definition(function: Any) -> str:
    """`file:line` where a function (or a class) is defined, "" when unknown."""
    try:
        target = inspect.unwrap(getattr(function, "__func__", function))
        return f"{shown(inspect.getsourcefile(target) or '')}:{inspect.getsourcelines(target)[1]}"
    except (TypeError, OSError, ValueError):
        return ""


def import_impl(role: RoleSpec, python_path: list[Path], bundle_path: Path) -> Any:
    """The class (or factory) `role.impl` names, imported with the bundle's `python_path` first."""
    module_name, _, class_name = role.impl.partition(":")
    for path in reversed(python_path):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        top = sys.modules.get(module_name.split(".")[0])
        if top is not None and Path(getattr(top, "__file__", None) or "/").resolve().parent == bundle_path.resolve():
            raise RoleError(
                f"role `{role.name}`: `{module_name}` resolves into the bundle itself, because the bundle's directory "
                f"is named `{bundle_path.name}` like the impl's package; build it into a directory with another name"
            ) from None
        if error.name is not None and error.name != module_name and not module_name.startswith(error.name + "."):
            # the impl module exists, but something it imports does not
            raise RoleError(
                f"role `{role.name}`: importing `{module_name}` failed{_at(place(error, python_path))}: {error}; "
                f"install `{error.name}` or fix the import"
            ) from None
        where = ", ".join(str(p) for p in python_path) or "the import path"
        raise RoleError(
            f"role `{role.name}`: cannot import `{module_name}` ({error}{_module_suggestion(error.name or module_name, python_path)}); "
            f"flowrt looked in {where}. "
            f"Put `{module_name.replace('.', '/')}.py` beside the .flow file or its parent directory"
        ) from None
    except Exception as error:  # noqa: BLE001 - the user's module failed while importing: say where
        raise RoleError(
            f"role `{role.name}`: importing `{module_name}` failed{_at(place(error, python_path))}: {type(error).__name__}: {error}; "
            "fix the module (it is imported when the runtime opens)"
        ) from None
    target: Any = module
    for part in class_name.split("."):
        owner, target = target, getattr(target, part, None)
        if target is None:
            close = _closest(part, [n for n in dir(owner) if not n.startswith("_")])
            suggestion = f" (did you mean `{class_name[: -len(part)]}{close}`?)" if close else ""
            raise RoleError(
                f"role `{role.name}`: module `{module_name}` has no `{class_name}`{suggestion}; check `impl` in the .flow file"
            )
    if not callable(target):
        raise RoleError(
            f"role `{role.name}`: `{role.impl}` is a {type(target).__name__}, not a class; "
            "point `impl` at the class that implements the role's interfaces"
        )
    return target


def _closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to a misspelt `word`, if one is close enough (difflib's ratio >= 0.6)."""
    close = difflib.get_close_matches(word, sorted(set(candidates)), n=1, cutoff=0.6)
    return close[0] if close else None


def _module_suggestion(missing: str, python_path: list[Path]) -> str:
    """A did-you-mean for a module that is not there: its package's modules, or for a top-level
    name the modules on the bundle's python_path (only those: listing all of sys.path is slow)."""
    parent, _, leaf = missing.rpartition(".")
    if parent:
        package = sys.modules.get(parent)
        places = list(getattr(package, "__path__", None) or [])
    else:
        places = [str(path) for path in python_path]
    close = _closest(leaf, _module_names(places))
    return f"; did you mean `{parent}.{close}`?" if close and parent else f"; did you mean `{close}`?" if close else ""


def _module_names(places: Iterable[str]) -> list[str]:
    """The modules and packages (namespace packages too: directories) directly in `places`."""
    names = []
    for directory in places:
        try:
            entries = list(Path(directory).iterdir())
        except OSError:  # not a directory, or unreadable: nothing to suggest from it
            continue
        for entry in entries:
            name = entry.stem if entry.suffix == ".py" else entry.name
            if name.isidentifier() and (entry.suffix == ".py" or entry.is_dir()) and name != "__pycache__":
                names.append(name)
    return names


def construct(role: RoleSpec, cls: Any, python_path: list[Path], count: int | None = None) -> list[Any]:
    """One instance of `cls` per replica (or `count` of them), each constructed without arguments."""
    instances = []
    for _ in range(role.replicas if count is None else count):
        try:
            instances.append(cls())
        except Exception as error:  # noqa: BLE001 - the user's __init__: a clear error, not a traceback
            where = place(error, python_path) or definition(cls)
            raise RoleError(
                f"role `{role.name}`: `{role.impl}()` raised {type(error).__name__}: {error}{_at(where)}; "
                "flowrt constructs a role's class without arguments: give `__init__`'s parameters defaults "
                "and load models in `async def setup(self, ctx)`"
            ) from None
    return instances


def call_shapes(role: RoleSpec, interface: str) -> list[tuple[str, ...]]:
    """The sets of keyword fields `interface` can be called with, over every graph that runs it:
    one per input group that can fire (a join passes all its fields at once)."""
    shapes: list[tuple[str, ...]] = []
    for tables in role.interfaces[interface].graphs.values():
        if tables.join is not None:
            candidates: Iterable[tuple[str, ...]] = [tuple(j.field for j in tables.join)]
        else:
            candidates = [tuple(dict.fromkeys(g.fields)) for g in tables.groups if g.routing != "dead"]
        for shape in candidates:
            if shape not in shapes:
                shapes.append(shape)
    return shapes


def check_instance(role: RoleSpec, instance: Any) -> None:
    """Hold one instance to the role's interfaces and `setup` (RoleError saying what to change)."""
    kind = type(instance).__name__
    for interface in role.interfaces:
        method = getattr(instance, interface, None)
        if method is None:
            raise RoleError(
                f"role `{role.name}`: `{kind}` has no method `{interface}`; add "
                f"`async def {interface}(self, ctx, ...)` taking the interface's input fields"
            )
        _check_callable(role, kind, interface, method)
        _check_signature(role, kind, interface, method, call_shapes(role, interface))
    setup = getattr(instance, "setup", None)
    if setup is not None and (not callable(setup) or inspect.isasyncgenfunction(setup) or inspect.isgeneratorfunction(setup)):
        raise RoleError(
            f"role `{role.name}`: `{kind}.setup`{_at(definition(setup))} must be `async def setup(self, ctx)` "
            "or `def setup(self, ctx)` that returns (flowrt runs it once per replica when it opens)"
        )


def _check_callable(role: RoleSpec, kind: str, interface: str, method: Any) -> None:
    if callable(method):
        return  # `async def` and async generators run on the loop, plain ones on the replica's thread
    raise RoleError(
        f"role `{role.name}`: `{kind}.{interface}` is not a method but a value of type `{type(method).__name__}`; write it as "
        f"`async def {interface}(self, ctx, ...)` (or `def` for blocking work) returning a dict of output fields, "
        "or as a generator yielding them"
    )


def _check_signature(role: RoleSpec, kind: str, interface: str, method: Any, shapes: list[tuple[str, ...]]) -> None:
    try:
        parameters = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        return  # no signature to read (a C function): calls will tell
    P = inspect.Parameter
    name = f"`{kind}.{interface}`{_at(definition(method))}"
    positional = [p for p in parameters if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    if not positional and not any(p.kind is P.VAR_POSITIONAL for p in parameters):
        raise RoleError(
            f"role `{role.name}`: {name} takes no `ctx`; flowrt calls it as `{interface}(ctx, **fields)`: "
            f"write `async def {interface}(self, ctx, ...)`"
        )
    ctx = positional[0] if positional else None
    rest = [p for p in parameters if p is not ctx]
    blocked = [p.name for p in rest if p.kind is P.POSITIONAL_ONLY and p.default is P.empty]
    if blocked:
        raise RoleError(
            f"role `{role.name}`: {name} has positional-only parameters {', '.join(blocked)} after `ctx`; "
            "fields are passed by keyword: remove the `/`"
        )
    any_keyword = any(p.kind is P.VAR_KEYWORD for p in rest)
    keywords = {p.name: p for p in rest if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)}
    every_field = list(dict.fromkeys(f for shape in shapes for f in shape))
    if ctx is not None and ctx.name in every_field:
        raise RoleError(
            f"role `{role.name}`: {name} names its first parameter `{ctx.name}`, like the input field `{ctx.name}`; "
            "rename the parameter (flowrt passes the context first, then the fields by keyword)"
        )
    fix = (
        f"take the fields as keyword arguments (`async def {interface}(self, ctx, "
        + ", ".join(f"{f}=None" if len(shapes) > 1 else f for f in every_field)
        + ")`) or as `**fields`"
    )
    for shape in shapes:
        unknown = [] if any_keyword else [f for f in shape if f not in keywords]
        if unknown:
            raise RoleError(
                f"role `{role.name}`: {name} does not take {_fields(unknown)}, which interface `{interface}` passes "
                f"when {_group(shape)} fires; {fix}"
            )
        required = [p.name for p in keywords.values() if p.default is P.empty and p.name not in shape]
        if required:
            raise RoleError(
                f"role `{role.name}`: {name} requires {_fields(required)}, which interface `{interface}` does not pass "
                f"when {_group(shape)} fires; {fix}"
            )


def _fields(names: list[str]) -> str:
    return ("field " if len(names) == 1 else "fields ") + ", ".join(f"`{n}`" for n in names)


def _group(shape: tuple[str, ...]) -> str:
    return f"its input group `{' & '.join(shape)}`" if shape else "it"
