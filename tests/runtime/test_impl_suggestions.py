"""A misspelt `impl` gets a did-you-mean when the runtime opens (issue 33): a class name close
to one the module defines, a module close to one in its package, a top-level package close to
one on the bundle's python_path (a directory without `__init__.py` included). Each test opens a
real bundle whose role's module is a real file, with a package name of its own (modules stay
imported for the rest of the session)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from flowrt.control import RoleError, Runtime
from tests.runtime.harness import bundle_of

ROLES = """
class Narrator:
    async def tell(self, ctx, prompt):
        return {"story": prompt}
"""


def flow(impl: str) -> str:
    return f"""
placeholder prompt: Text

role narrator {{
    impl "{impl}"
    interface tell {{ in prompt  out story: Text }}
}}

graph g {{
    entry  prompt
    return story
}}
"""


def opening_fails(tmp_path: Path, package: str, impl: str) -> str:
    (tmp_path / package).mkdir()  # a namespace package, as the examples' are
    (tmp_path / package / "roles.py").write_text(ROLES)
    bundle = bundle_of(flow(impl), tmp_path)
    with pytest.raises(RoleError) as raised:
        asyncio.run(Runtime.open(bundle))
    return str(raised.value)


def test_a_misspelt_class_gets_the_class_it_meant(tmp_path):
    message = opening_fails(tmp_path, "suggest_class", "suggest_class.roles:Narator")
    assert message == (
        "role `narrator`: module `suggest_class.roles` has no `Narator` (did you mean `Narrator`?); "
        "check `impl` in the .flow file"
    )


def test_a_misspelt_module_gets_the_module_its_package_holds(tmp_path):
    message = opening_fails(tmp_path, "suggest_module", "suggest_module.rols:Narrator")
    assert "cannot import `suggest_module.rols` (No module named 'suggest_module.rols'; " in message
    assert "did you mean `suggest_module.roles`?)" in message


def test_a_misspelt_package_gets_the_package_on_the_python_path(tmp_path):
    message = opening_fails(tmp_path, "suggest_package", "sugest_package.roles:Narrator")
    assert "(No module named 'sugest_package'; did you mean `suggest_package`?)" in message


def test_nothing_close_gets_no_suggestion(tmp_path):
    message = opening_fails(tmp_path, "suggest_none", "suggest_none.roles:Storyteller")
    assert message.endswith("has no `Storyteller`; check `impl` in the .flow file")


def test_a_module_nothing_resembles_gets_no_suggestion(tmp_path):
    message = opening_fails(tmp_path, "suggest_far", "zzz_unlike_any.roles:Narrator")
    assert "(No module named 'zzz_unlike_any'); flowrt looked in" in message
