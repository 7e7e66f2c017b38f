"""The standard .flow modules and docs/stdlib.md's examples check clean, and the wheel's package
data takes the tokenizer's vocabulary (none of this needs `tokenizers`)."""

from __future__ import annotations

import fnmatch
import re
import tomllib

from flowc.check import check_source
from flowstd.tokenizer.core import default_path
from tests.conftest import REPO

LIB = REPO / "stdlib" / "flowstd" / "lib"


def test_the_standard_modules_check_clean():
    for path in sorted(LIB.glob("*.flow")):
        result = check_source(path.read_text(encoding="utf-8"), path.name, path)
        assert result.diagnostics == [], (path.name, [f"{d.code} {d.message}" for d in result.diagnostics])


def test_the_guides_examples_check_clean():
    guide = (REPO / "docs" / "stdlib.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```flow\n(.*?)```", guide, re.DOTALL)
    assert len(blocks) >= 2
    for index, text in enumerate(blocks):
        result = check_source(text, f"docs/stdlib.md#example-{index + 1}", REPO / "docs" / "example.flow")
        assert result.diagnostics == [], [f"{d.code} {d.message}" for d in result.diagnostics]


def test_importing_both_text_modules_declares_no_name_twice():
    text = "import text\nimport tokenizer\n\ngraph g {\n    entry  messages\n    return chat_tokens\n}\n"
    result = check_source(text, "both.flow", REPO / "docs" / "both.flow")
    assert result.diagnostics == [], [f"{d.code} {d.message}" for d in result.diagnostics]


def test_the_wheel_ships_the_vocabulary():
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["flowstd"]
    shipped = default_path().relative_to(REPO / "stdlib" / "flowstd").as_posix()
    assert shipped == "tokenizer/tokenizer.json"
    assert any(fnmatch.fnmatch(shipped, pattern) for pattern in package_data), (shipped, package_data)
