"""The documentation compiles: every ```flow example checks clean and is canonically formatted,
and the diagnostic catalogue matches the registry."""

from __future__ import annotations

import re

import pytest

from flowc.check import CODES, check_source, schema
from flowc.check.catalog import markdown
from flowc.fmt import format_source
from tests.conftest import REPO

LANGUAGE = (REPO / "docs/language.md").read_text()
BLOCKS = re.findall(r"```flow\n(.*?)```", LANGUAGE, re.DOTALL)


def test_the_reference_has_examples():
    assert len(BLOCKS) >= 9


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_checks_clean_and_is_formatted(index):
    text = BLOCKS[index]
    result = check_source(text, f"docs/language.md#example-{index + 1}", REPO / "docs" / "example.flow")
    assert result.diagnostics == [], [f"{d.code} {d.message}" for d in result.diagnostics]
    assert format_source(text)[0] == text


def test_readme_example_compiles():
    readme = (REPO / "README.md").read_text()
    for text in re.findall(r"```flow\n(.*?)```", readme, re.DOTALL):
        assert check_source(text, "README.md").diagnostics == []


def test_diagnostic_catalogue_is_current():
    assert (REPO / "docs/diagnostics.md").read_text() == markdown(), "run `make docs`"
    assert all(f"`{code}`" in markdown() for code in CODES)


def test_every_setting_is_documented():
    for block in (schema.ROLE, schema.INTERFACE, schema.GRAPH, schema.BATCH, *schema.GLOBAL_KINDS.values()):
        for key in block.keys:
            assert f"`{key.name}`" in LANGUAGE or f"    {key.name} " in LANGUAGE, f"document `{key.name}` of {block.context}"
    for policy in schema.LB_POLICIES:
        assert f"`{policy}`" in LANGUAGE
