"""The standard .flow modules and docs/stdlib.md's examples check clean, and the wheel's package
data takes the tokenizer's vocabulary (none of this needs `tokenizers`)."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib

from flowc.check import check_source
from flowc.codegen import build_bundle
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


def test_the_llm_modules_import_together_sharing_one_kv_global(tmp_path):
    # each imports lib/kvcache.flow, loaded once: one `global kv`, which every LLM role uses
    text = (
        "import llm\nimport multimodal\nimport voice\n\n"
        "graph chat {\n    entry  messages\n    stream text_delta ordered\n    return generation\n}\n\n"
        "graph draw {\n    entry  request\n    return image\n}\n\n"
        "graph talk {\n    entry  voice_request\n    stream speech ordered\n    return turn\n}\n"
    )
    source = tmp_path / "all.flow"
    source.write_text(text)
    result = check_source(text, "all.flow", source)
    assert result.diagnostics == [], [f"{d.code} {d.message}" for d in result.diagnostics]
    assert set(result.program.globals) == {"kv", "detokenizer_state"}
    users = {name for name, role in result.program.roles.items() if "kv" in role.config.get("uses", ())}
    assert users == {"llm", "mm_llm", "dit", "thinker"}
    bundle = build_bundle(result.program, source, tmp_path / "bundle")
    bundle.write(tmp_path / "bundle")
    plan = json.loads((tmp_path / "bundle" / "plan.json").read_text())
    assert sorted(plan["graphs"]) == ["chat", "draw", "talk"]
    assert [name for name, spec in plan["globals"].items() if spec["kind"] == "KVCache"] == ["kv"]


def test_the_wheel_ships_the_vocabulary():
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["flowstd"]
    shipped = default_path().relative_to(REPO / "stdlib" / "flowstd").as_posix()
    assert shipped == "tokenizer/tokenizer.json"
    assert any(fnmatch.fnmatch(shipped, pattern) for pattern in package_data), (shipped, package_data)
