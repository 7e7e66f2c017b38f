"""The settings the language knows, as data: which keys each block takes and what values.

Roles, interfaces and graphs take `key value` settings; globals and `batch` take `{ key value }`
blocks. `interpret` turns a block of `ast.Setting`s into plain Python values and lists every
problem it met (unknown key with a did-you-mean, duplicate, wrong kind, out of range). The
checks report those problems; the resolver only keeps the values. The language server reads
the same tables for completion and hover.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from flowc.diagnostics import Diagnostic, Note
from flowc.syntax import ast


class Kind(StrEnum):
    INT = "a whole number"
    NUMBER = "a number"
    DURATION = "a duration such as `30s` or `5ms`"
    SIZE = "a size such as `16GiB`"
    STRING = "a string"
    NAME = "a name"
    NAMES = "one or more names"
    BLOCK = "a `{ ... }` block"


@dataclass(frozen=True)
class Key:
    """One setting. A number must lie in [minimum, maximum]; with `positive` it must also be
    above 0 (a timeout of 0s would cancel every call at once)."""

    name: str
    kind: Kind
    doc: str
    minimum: float | None = None
    choices: tuple[str, ...] = ()
    block: Schema | None = None
    maximum: float | None = None
    positive: bool = False

    @property
    def range_text(self) -> str | None:
        """The accepted range in the user's units, e.g. "1 to 1024" or "more than 0s, at most 24h"."""
        low = "more than 0" + ("s" if self.kind is Kind.DURATION else "") if self.positive else None
        if low is None and self.minimum is not None:
            low = f"at least {self.show(self.minimum)}"
        high = f"at most {self.show(self.maximum)}" if self.maximum is not None else None
        if low and high and low.startswith("at least"):
            return f"{self.show(self.minimum)} to {self.show(self.maximum)}"
        return ", ".join(p for p in (low, high) if p) or None

    @property
    def described(self) -> str:
        """The doc with the range, as hints and hovers show it."""
        return f"{self.doc} ({self.range_text})" if self.range_text else self.doc

    def show(self, value: float) -> str:
        """A bound in the units the user writes (`24h`, `1024TiB`)."""
        if self.kind is Kind.DURATION:
            return _duration(value)
        if self.kind is Kind.SIZE:
            return _size(value)
        return _number(value)


@dataclass(frozen=True)
class Schema:
    context: str  # how messages name the block, e.g. "a role"
    keys: tuple[Key, ...]
    by_name: dict[str, Key] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {k.name: k for k in self.keys})


LB_POLICIES = ("round_robin", "session", "broadcast", "load_aware")
DTYPES = ("float16", "bfloat16", "float32", "float8_e4m3", "int8")
TIERS = ("device", "host", "disk")
# the OpenAI endpoints a graph may serve (flowc.check.endpoints)
ENDPOINTS = ("chat", "images", "speech", "embeddings", "realtime")

# The bounds of resource settings (docs/language.md, "Limits"). They are generous for real
# deployments and catch the typo that would make the runtime allocate for ever or cancel at once.
MAX_REPLICAS = 1024  # replicas of one role: each is a process or actor with its own state
MAX_GPUS = 1024  # GPUs of one replica (a replica may span `nodes` machines)
MAX_NODES = 128  # machines spanned by one replica
MAX_BATCH = 65536  # activations handed to a role at once
MAX_BATCH_WAIT_S = 60.0  # a batch that waits longer for company is a stalled call
MAX_TIMEOUT_S = 24 * 3600.0  # a longer limit is no limit: leave `timeout` out instead
_TIMEOUT = {"positive": True, "maximum": MAX_TIMEOUT_S}

BATCH = Schema(
    "a `batch` block",
    (
        Key("max", Kind.INT, "largest batch the role is given", minimum=1, maximum=MAX_BATCH),
        Key("wait", Kind.DURATION, "longest time a request waits for a batch to fill", minimum=0, maximum=MAX_BATCH_WAIT_S),
    ),
)

ROLE = Schema(
    "a role",
    (
        Key("impl", Kind.STRING, 'the Python class implementing the interfaces, "module:Class"'),
        Key("replicas", Kind.INT, "number of replicas", minimum=1, maximum=MAX_REPLICAS),
        Key("lb", Kind.NAME, "replica selection policy", choices=LB_POLICIES),
        Key("gpus", Kind.INT, "GPUs owned by each replica", minimum=0, maximum=MAX_GPUS),
        Key("nodes", Kind.INT, "machines spanned by each replica", minimum=1, maximum=MAX_NODES),
        Key("uses", Kind.NAMES, "session-scoped globals the role reads and writes"),
        Key("batch", Kind.BLOCK, "batching of requests to this role", block=BATCH),
        Key("timeout", Kind.DURATION, "default timeout of the role's interfaces", **_TIMEOUT),
    ),
)

INTERFACE = Schema(
    "an interface",
    (
        Key("timeout", Kind.DURATION, "time one activation may take before the call is cancelled", **_TIMEOUT),
        Key("batch", Kind.BLOCK, "batching of this interface's activations", block=BATCH),
    ),
)

GRAPH = Schema(
    "a graph",
    (
        Key("timeout", Kind.DURATION, "time one call of the graph may take before it is cancelled", **_TIMEOUT),
        Key("serves", Kind.NAMES, "the OpenAI endpoints that serve the graph (docs/openai.md)", choices=ENDPOINTS),
    ),
)

GLOBAL_KINDS: dict[str, Schema] = {
    "KVCache": Schema(
        "a `KVCache` global",
        (
            Key("layers", Kind.INT, "transformer layers stored", minimum=1, maximum=1024),
            Key("page_tokens", Kind.INT, "tokens per KV page", minimum=1, maximum=65536),
            Key("slices", Kind.NAMES, "slices stored per layer, e.g. [k, v]"),
            Key("heads", Kind.INT, "KV heads per layer", minimum=1, maximum=1024),
            Key("head_dim", Kind.INT, "size of one head", minimum=1, maximum=65536),
            Key("dtype", Kind.NAME, "element type", choices=DTYPES),
            Key("capacity", Kind.SIZE, "pool capacity", minimum=1, maximum=2**50),
            Key("tiers", Kind.NAMES, "storage tiers, fastest first", choices=TIERS),
        ),
    ),
    "History": Schema(
        "a `History` global",
        (Key("max_turns", Kind.INT, "turns kept per session", minimum=1, maximum=1_000_000),),
    ),
    "Params": Schema(
        "a `Params` global",
        (
            Key("arch", Kind.STRING, "architecture name the shared weights are keyed by"),
            Key("dtype", Kind.NAME, "element type", choices=DTYPES),
        ),
    ),
}

Scalar = int | float | str | tuple[str, ...] | dict


@dataclass
class Interpreted:
    values: dict[str, Scalar]
    problems: list[Diagnostic]
    settings: dict[str, ast.Setting]  # first occurrence of each known key


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(word, sorted(set(candidates)), n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else None


def interpret(settings: Sequence[ast.Setting], schema: Schema) -> Interpreted:
    result = Interpreted({}, [], {})
    for setting in settings:
        name = setting.key.text
        key = schema.by_name.get(name)
        if key is None:
            known = ", ".join(f"`{k}`" for k in schema.by_name)
            hint = did_you_mean(name, schema.by_name) or f"{schema.context} takes {known}"
            result.problems.append(Diagnostic("E120", f"unknown setting `{name}` in {schema.context}", setting.key.span, hint))
            continue
        if name in result.settings:
            first = result.settings[name]
            result.problems.append(
                Diagnostic(
                    "E121",
                    f"`{name}` is set twice in {schema.context}",
                    setting.key.span,
                    "remove one of them",
                    (Note(first.key.span, "first set here"),),
                )
            )
            continue
        result.settings[name] = setting
        value = _convert(setting, key, result.problems)
        if value is not None:
            result.values[name] = value
    return result


def _convert(setting: ast.Setting, key: Key, problems: list[Diagnostic]) -> Scalar | None:
    values = setting.values
    if key.kind is Kind.NAMES:
        names = _names(values)
        if names is None:
            problems.append(_wrong_kind(setting, key))
            return None
        for value, name in zip(_flat(values), names, strict=True):
            if key.choices and name not in key.choices:
                problems.append(_bad_choice(value, name, key))
        return tuple(names)
    if len(values) != 1:
        problems.append(
            Diagnostic("E122", f"`{key.name}` takes one value, {key.kind.value}", values[1].span, "remove the extra values")
        )
        return None
    value = values[0]
    converted = _scalar(value, key)
    if converted is None:
        problems.append(_wrong_kind(setting, key))
        return None
    if key.kind is Kind.BLOCK:
        assert key.block is not None and isinstance(value, ast.BlockValue)
        inner = interpret(value.entries, key.block)
        problems.extend(inner.problems)
        return inner.values
    if key.choices and converted not in key.choices:
        problems.append(_bad_choice(value, str(converted), key))
        return None
    if isinstance(converted, (int, float)) and not isinstance(converted, bool):
        problem = _out_of_range(value, converted, key)
        if problem is not None:
            problems.append(problem)
            return None
    return converted


def _out_of_range(value: ast.Value, number: float, key: Key) -> Diagnostic | None:
    shown = value.text if isinstance(value, (ast.DurationValue, ast.SizeValue)) else _number(number)
    if key.positive and number <= 0:
        bound = "more than 0s" if key.kind is Kind.DURATION else "more than 0"
    elif key.minimum is not None and number < key.minimum:
        bound = f"at least {key.show(key.minimum)}"
    elif key.maximum is not None and number > key.maximum:
        bound = f"at most {key.show(key.maximum)}"
    else:
        return None
    hint = f"{key.name}: {key.described}"
    if key.positive and key.kind is Kind.DURATION:
        hint += f"; leave `{key.name}` out for no limit"
    return Diagnostic("E123", f"`{key.name}` must be {bound}, not {shown}", value.span, hint)


def _scalar(value: ast.Value, key: Key) -> Scalar | None:
    match key.kind, value:
        case Kind.INT, ast.IntValue(value=v):
            return v
        case Kind.NUMBER, ast.IntValue(value=v) | ast.FloatValue(value=v):
            return v
        case Kind.DURATION, ast.DurationValue(seconds=s):
            return s
        case Kind.DURATION, ast.IntValue(value=0):
            return 0.0
        case Kind.SIZE, ast.SizeValue(bytes=b):
            return b
        case Kind.STRING, ast.StringValue(value=v):
            return v
        case Kind.NAME, ast.NameValue(name=n):
            return n
        case Kind.BLOCK, ast.BlockValue():
            return {}
    return None


def _flat(values: Sequence[ast.Value]) -> list[ast.Value]:
    if len(values) == 1 and isinstance(values[0], ast.ListValue):
        return list(values[0].items)
    return list(values)


def _names(values: Sequence[ast.Value]) -> list[str] | None:
    flat = _flat(values)
    if not flat or not all(isinstance(v, ast.NameValue) for v in flat):
        return None
    return [v.name for v in flat]  # type: ignore[union-attr]


def _describe_value(value: ast.Value) -> str:
    match value:
        case ast.IntValue(value=v):
            return f"the number `{v}`"
        case ast.FloatValue(text=t):
            return f"the number `{t}`"
        case ast.DurationValue(text=t):
            return f"the duration `{t}`"
        case ast.SizeValue(text=t):
            return f"the size `{t}`"
        case ast.StringValue():
            return "a string"
        case ast.NameValue(name=n):
            return f"the name `{n}`"
        case ast.ListValue():
            return "a list"
    return "a block"


def _wrong_kind(setting: ast.Setting, key: Key) -> Diagnostic:
    value = setting.values[0]
    hint = f"{key.name}: {key.described}"
    if key.kind is Kind.DURATION and isinstance(value, (ast.IntValue, ast.FloatValue)):
        hint = f"add a unit: `{_describe_value(value).split('`')[1]}s` or `{_describe_value(value).split('`')[1]}ms`"
    if key.kind is Kind.NAME and isinstance(value, ast.StringValue) and key.choices:
        hint = f"write the name without quotes: {', '.join(f'`{c}`' for c in key.choices)}"
    return Diagnostic(
        "E122",
        f"`{key.name}` takes {key.kind.value}, not {_describe_value(value)}",
        value.span,
        hint,
    )


def _bad_choice(value: ast.Value, name: str, key: Key) -> Diagnostic:
    code = "E124" if key.name == "lb" else "E122"
    choices = ", ".join(f"`{c}`" for c in key.choices)
    what = "load-balancing policy" if key.name == "lb" else f"value for `{key.name}`"
    hint = did_you_mean(name, key.choices)
    hint = f"{hint} The choices are {choices}." if hint else f"the choices are {choices}"
    return Diagnostic(code, f"unknown {what} `{name}`", value.span, hint)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60), ("s", 1), ("ms", 1e-3)):
        if seconds >= size and float(seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    return f"{_number(seconds)}s"


def _size(size: float) -> str:
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= factor and float(size / factor).is_integer():
            return f"{int(size / factor)}{unit}"
    return f"{_number(size)} byte" + ("" if size == 1 else "s")
