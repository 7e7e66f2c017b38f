"""The documentation compiles: every ```flow example checks clean and is canonically formatted,
the diagnostic catalogue matches the registry, every command is in the README, and the CI
guide's commands, workflow and pre-commit configurations are ones flowc accepts."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

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


def test_separators_are_what_the_reference_says():
    # docs/language.md, "Lexical structure": commas separate the entries of setting blocks and
    # the names of one clause, never two clauses or settings
    from flowc.syntax import parse

    accepted = [
        "global kv: KVCache { layers 2, page_tokens 16 }",
        "global kv: KVCache {\n    layers 2\n    page_tokens 16\n}",
        "role r {\n    batch { max 8, wait 5ms }\n}",
        "graph g {\n    entry  a, b\n    return x, y\n}",
        "role r {\n    interface i { in a  out x: Text, y: Tensor }\n}",
    ]
    rejected = [
        "graph g {\n    entry audio, stream y\n}",
        'role r {\n    impl "m:R",\n    replicas 2\n}',
        "role r {\n    interface i { in a, out x: Text }\n}",
    ]
    for text in accepted:
        assert parse(text).module is not None, text
    for text in rejected:
        assert parse(text).module is None, text
    assert "entries separated by whitespace or commas" in LANGUAGE and "does not\n  separate clauses" in LANGUAGE


def test_limits_table_is_the_schemas():
    table = LANGUAGE.split("### Limits", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| (`[^|]+`[^|]*) \| ([^|]+) \|$", table, re.MULTILINE))
    documented: dict[str, str] = {}
    for setting, accepted in rows.items():
        for name in re.findall(r"`(\w+)`", setting.split(":")[-1] if ":" in setting else setting):
            documented[name] = re.sub(r"(?<=\d),(?=\d)", "", accepted.split(";")[0]).strip()
    for block in (schema.ROLE, schema.INTERFACE, schema.GRAPH, schema.BATCH, *schema.GLOBAL_KINDS.values()):
        for key in block.keys:
            if key.range_text is not None:
                assert documented.get(key.name) == key.range_text, f"docs/language.md, Limits: `{key.name}` is {key.range_text}"


def test_the_reference_shows_the_role_method_and_links_the_runtime_guide():
    roles = LANGUAGE.split("## Roles", 1)[1].split("\n## ", 1)[0]
    assert "```python" in roles and "async def setup(self, ctx)" in roles and "async def write(self, ctx, features)" in roles
    assert "(runtime.md#roles)" in roles


def _anchors(markdown_text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", markdown_text, flags=re.DOTALL), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_relative_links_in_the_docs_resolve():
    pages = [REPO / "README.md", REPO / "editors/vscode/README.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"```.*?```", "", text, flags=re.DOTALL)):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked.read_text(encoding="utf-8")):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, broken


# A file the docs' prose cites by its path from the repository's root (`runtime/flowrt/...`) or
# in the sessions' shared folder (`shared/...`, which is not part of the repository); a pipeline's
# own `tests/GRAPH.input.json` (one level, beside its .flow file) is no citation.
_CITED = re.compile(
    r"(?<![\w./-])((?:shared|runtime|compiler|stdlib|tests/[\w.-]+|examples|docs|bench|editors|grammars|cuda|golden)"
    r"/[\w./-]*\w)"
)
# DESIGN.md lives outside the repository; its citations ("shared/DESIGN.md §7") are another issue's
_NOT_YET = frozenset({"shared/DESIGN.md"})


def test_the_docs_cite_only_files_in_the_repository():
    # issue 33: docs/engines.md cited shared/research/sglang-surface.md, which no reader has
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    missing = [
        f"{page.relative_to(REPO)}: {cited}"
        for page in pages
        for cited in _CITED.findall(re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL))
        if cited not in _NOT_YET and not (REPO / cited).exists()
    ]
    assert not missing, missing


def test_the_bundle_guide_describes_this_release():
    bundle = (REPO / "docs/bundle.md").read_text(encoding="utf-8")
    assert "serving them (`flowc run`) and the Ray launcher come next" not in bundle
    assert "`flowc run DIR`" in bundle and "docs/runtime.md" in bundle
    assert "--deploy local|ray" in bundle and "docs/deploy.md" in bundle


def test_the_stream_bounds_the_runtime_guide_states_are_the_runtimes():
    from flowrt.control import bounds

    guide = (REPO / "docs/runtime.md").read_text()
    rule = " ".join(guide.split("13. **Bounded streams**")[1].split("\n## ")[0].split())
    assert f"every {bounds.PAUSE_EVERY} frames" in rule
    assert f"has {bounds.OUTBOX_HIGH} events" in rule
    assert f"while {bounds.CHILDREN_HIGH} activations" in rule


def test_every_command_is_in_the_readmes_command_line():
    from flowc.cli import main

    block = (REPO / "README.md").read_text().split("## The command line", 1)[1].split("```", 2)[1]
    for name in main.commands:
        assert re.search(rf"^flowc {name}\b", block, re.MULTILINE), f"document `flowc {name}` in README's command line"


def test_the_readme_lists_graphviz_as_the_svg_prerequisite():
    # issue 33: `flowc graph --format svg` runs Graphviz's `dot`; the quick start says so, with
    # the same packages the error names when `dot` is missing
    from flowc.plan.pictures import INSTALL_GRAPHVIZ

    quick_start = " ".join((REPO / "README.md").read_text().split("## Quick start", 1)[1].split("```", 1)[0].split())
    assert "`flowc graph --format svg` runs Graphviz's `dot`" in quick_start
    assert INSTALL_GRAPHVIZ in quick_start


CI = (REPO / "docs/ci.md").read_text()
CI_YAML = re.findall(r"```yaml\n(.*?)```", CI, re.DOTALL)


def _flowc_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("flowc ")]


def test_the_ci_guides_commands_exist_with_their_options():
    from flowc.cli import main

    workflow = next(yaml.safe_load(b) for b in CI_YAML if "jobs:" in b)
    lines = _flowc_lines("\n".join(step.get("run", "") for step in workflow["jobs"]["flowc"]["steps"]))
    lines += _flowc_lines("\n".join(re.findall(r"```sh\n(.*?)```", CI, re.DOTALL)))
    assert {line.split()[1] for line in lines} >= {"check", "fmt", "build", "test", "diff"}
    for line in lines:
        words = shlex.split(line.split(" #")[0])
        command = main.commands[words[1]]
        known = {option for param in command.params for option in getattr(param, "opts", [])}
        unknown = [w for w in words[2:] if w.startswith("-") and w not in known]
        assert not unknown, f"docs/ci.md: `{line}` uses {unknown}, which `flowc {words[1]}` does not take"


def test_the_ci_guides_pre_commit_configs_use_the_hooks_we_ship():
    hooks = {hook["id"]: hook for hook in yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())}
    configs = [yaml.safe_load(b) for b in CI_YAML if "repos:" in b]
    remote, local = configs
    assert {h["id"] for h in remote["repos"][0]["hooks"]} == set(hooks)
    for hook in local["repos"][0]["hooks"]:
        shipped = hooks[hook["id"]]
        assert hook["entry"] == shipped["entry"] and hook.get("files") == shipped.get("files")
        assert hook.get("pass_filenames", True) == shipped.get("pass_filenames", True)
