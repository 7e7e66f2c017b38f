"""Roles are held to their interfaces when the runtime opens (flowrt.control.impls): a role that
could not run a call fails the open with a RoleError naming the role, the place and the fix."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from flowrt.control import RoleError
from flowrt.errors import shown
from tests.runtime.harness import collect, open_runtime, returned

OR_GROUPS = """
placeholder a: Json
placeholder b: Json

role pick {
    impl "m:Pick"
    interface run { in a | b  out got: Json }
}

graph from_a {
    entry  a
    return got
}

graph from_b {
    entry  b
    return got
}
"""

JOIN = """
placeholder request: Json

role split {
    impl "m:Split"
    interface run { in request  out stream part: Json, note: Json }
}

role gather {
    impl "m:Gather"
    interface run { join { part: all, note: all }  out whole: Json }
}

graph g {
    entry  request
    return whole
}
"""


class Split:
    async def run(self, ctx, request):
        yield {"part": 1, "note": "x"}


def opening(text, tmp_path, roles):
    async def main():
        runtime = await open_runtime(text, tmp_path, roles)
        await runtime.close()

    asyncio.run(main())


def refused(text, tmp_path, roles) -> str:
    with pytest.raises(RoleError) as error:
        opening(text, tmp_path, roles)
    return str(error.value)


def line_of(function) -> str:
    """Where messages say `function` is: its file as shown (relative to the working directory) and line."""
    return f"{shown(__file__)}:{inspect.getsourcelines(function)[1]}"


class Both:
    async def run(self, ctx, a, b):
        return {"got": a}


class Defaults:
    async def run(self, ctx, a=None, b=None):
        return {"got": a if a is not None else b}


class Catchall:
    async def run(self, ctx, **fields):
        return {"got": fields}


def test_or_groups_pass_only_their_own_fields_so_the_others_need_defaults(tmp_path):
    message = refused(OR_GROUPS, tmp_path, {"pick": Both()})
    assert message.startswith("role `pick`: `Both.run` at ")
    assert line_of(Both.run) in message
    assert "requires field `b`, which interface `run` does not pass when its input group `a` fires" in message
    assert "async def run(self, ctx, a=None, b=None)" in message and "**fields" in message

    async def main():
        for role in (Defaults(), Catchall()):
            runtime = await open_runtime(OR_GROUPS, tmp_path, {"pick": role})
            assert returned(await collect(runtime, "from_b", {"b": 2}))["got"] in (2, {"b": 2})
            await runtime.close()

    asyncio.run(main())


class NoCtx:
    async def run(self):
        return {}


class WrongName:
    async def run(self, ctx, request=None):
        return {}


class Missing:
    async def other(self, ctx, a=None, b=None):
        return {}


class GeneratorSetup:
    async def setup(self, ctx):
        yield

    async def run(self, ctx, a=None, b=None):
        return {"got": a}


@pytest.mark.parametrize(
    ("role", "words"),
    [
        (NoCtx(), "`NoCtx.run` at {line} takes no `ctx`; flowrt calls it as `run(ctx, **fields)`"),
        (WrongName(), "`WrongName.run` at {line} does not take field `a`, which interface `run` passes"),
        (Missing(), "`Missing` has no method `run`; add `async def run(self, ctx, ...)`"),
        (GeneratorSetup(), "`GeneratorSetup.setup` at {line} must be `async def setup(self, ctx)` or `def setup"),
    ],
    ids=["no-ctx", "wrong-field", "missing", "generator-setup"],
)
def test_an_interface_that_could_not_run_is_refused_at_open(tmp_path, role, words):
    method = getattr(type(role), "setup", None) or getattr(type(role), "run", None)
    expected = words.format(line=line_of(method) if method else "")
    assert expected in refused(OR_GROUPS, tmp_path, {"pick": role})


class Gather:
    async def run(self, ctx, part, note):
        return {"whole": [part, note]}


class GatherMissingOne:
    async def run(self, ctx, part):
        return {"whole": part}


def test_a_join_passes_all_its_fields_at_once(tmp_path):
    async def main():
        runtime = await open_runtime(JOIN, tmp_path, {"split": Split(), "gather": Gather()})
        assert returned(await collect(runtime, "g", {"request": 1})) == {"whole": [[1], ["x"]]}
        await runtime.close()

    asyncio.run(main())
    assert "does not take field `note`" in refused(JOIN, tmp_path, {"split": Split(), "gather": GatherMissingOne()})


class FailingSetup:
    async def setup(self, ctx):
        raise RuntimeError("weights not found")

    async def run(self, ctx, a=None, b=None):
        return {}


def test_a_setup_that_raises_names_the_role_the_replica_and_the_line(tmp_path):
    message = refused(OR_GROUPS, tmp_path, {"pick": FailingSetup()})
    raise_line = inspect.getsourcelines(FailingSetup.setup)[1] + 1
    assert message.startswith("role `pick`: setup() of replica 0 raised RuntimeError: weights not found at ")
    assert f"{shown(__file__)}:{raise_line}" in message
