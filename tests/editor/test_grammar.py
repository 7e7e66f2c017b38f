"""The TextMate grammar against the compiler: fresh, complete on the examples, and agreeing with the lexer.

Tokens come from editors/vscode/scripts/tokenize.js, which runs the grammar through
vscode-textmate and Oniguruma exactly as VS Code does (node tools installed by `make test`).
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from lark import Lark

from flowc.check import check_file
from flowc.syntax import keywords
from flowc.syntax.parser import grammar_text
from tests.conftest import EXAMPLES, REPO

EDITOR = REPO / "editors" / "vscode"
FIXTURES = sorted((EDITOR / "tests" / "grammar").glob("*.flow"))
SNAPSHOTS = sorted((EDITOR / "tests" / "snap").glob("*.flow"))
STDLIB = sorted((REPO / "stdlib" / "flowstd" / "lib").glob("*.flow"))
HIGHLIGHTED = [*EXAMPLES, *FIXTURES, *STDLIB]


def _node_tools() -> None:
    if shutil.which("node") is None:
        pytest.fail("node is not installed; the editor tests need Node 20 and npm")
    if not (EDITOR / "node_modules" / "vscode-textmate").is_dir():
        pytest.fail("the editor's node tools are missing: run `make test` (it runs `npm ci` in editors/vscode)")


@functools.cache
def tokens() -> dict[str, list[list[dict]]]:
    _node_tools()
    files = [str(path) for path in HIGHLIGHTED]
    out = subprocess.run(
        ["node", str(EDITOR / "scripts" / "tokenize.js"), *files], capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(out.stdout)


def _code_point_tokens(path: Path) -> list[tuple[int, int, int, list[str]]]:
    """(line, start, end, scopes) per token, with columns in code points like the compiler's."""
    found = []
    lines = path.read_text(encoding="utf-8").split("\n")
    for number, (line, line_tokens) in enumerate(zip(lines, tokens()[str(path)], strict=True), start=1):
        units = [0]
        for char in line:
            units.append(units[-1] + len(char.encode("utf-16-le")) // 2)
        for token in line_tokens:
            start, end = units.index(token["start"]), units.index(min(token["end"], units[-1]))
            if end > start:
                found.append((number, start, end, token["scopes"]))
    return found


def test_the_json_grammar_is_generated_from_the_yaml_source():
    result = subprocess.run(
        [sys.executable, str(EDITOR / "scripts" / "build_grammar.py"), "--check"], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    source = yaml.safe_load((REPO / "grammars" / "flow.tmLanguage.yaml").read_text(encoding="utf-8"))
    generated = json.loads((EDITOR / "syntaxes" / "flow.tmLanguage.json").read_text(encoding="utf-8"))
    assert generated["repository"] == source["repository"]
    assert generated["scopeName"] == "source.flow"


def test_the_grammar_reserves_exactly_the_parsers_keywords():
    grammar = (EDITOR / "syntaxes" / "flow.tmLanguage.json").read_text(encoding="utf-8")
    not_a_setting = re.search(r"\(\?!\(\?:([a-z|]+)\)\\\\b\)", grammar)
    assert not_a_setting is not None
    assert sorted(not_a_setting.group(1).split("|")) == list(keywords())
    stray = json.loads(grammar)["repository"]["keyword"]["patterns"]
    words = {w for rule in stray[1:] for w in re.findall(r"[a-z]+", rule["match"].replace("\\b", " ")) if w != "b"}
    assert words | {"all"} == set(keywords())


@pytest.mark.parametrize("path", HIGHLIGHTED, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_token_outside_comments_is_scoped(path: Path):
    text = path.read_text(encoding="utf-8").split("\n")
    problems = []
    for line, start, end, scopes in _code_point_tokens(path):
        word = text[line - 1][start:end]
        if not word.strip() or any(s.startswith("comment.") for s in scopes):
            continue
        if scopes == ["source.flow"] or any(s.startswith("invalid.") for s in scopes):
            problems.append(f"{line}:{start + 1} {word!r} {scopes}")
    assert not problems, "tokens without a scope:\n" + "\n".join(problems)


# What the innermost scope of each kind of parser token may be.
_EXPECTED = {
    "keyword": ("keyword.", "storage.type.", "storage.modifier.", "constant.language."),
    "name": ("entity.name.", "entity.other.attribute-name.", "variable.", "support."),
    "string": ("string.quoted.", "punctuation.definition.string.", "constant.character.escape."),
    "number": ("constant.numeric.", "keyword.other.unit."),
    "punctuation": ("punctuation.", "keyword.operator."),
    "comment": ("comment.", "punctuation.definition.comment."),
}


@functools.cache
def _lexer() -> Lark:
    return Lark(grammar_text(), parser="lalr", lexer="basic")


def _category(lark: Lark, token_type: str) -> str:
    named = {"NAME": "name", "STRING": "string", "COMMENT": "comment"}
    if token_type in named:
        return named[token_type]
    if token_type in ("INT", "FLOAT", "DURATION", "SIZE"):
        return "number"
    pattern = lark.get_terminal(token_type).pattern
    return "keyword" if pattern.value.isalpha() else "punctuation"


@pytest.mark.parametrize("path", HIGHLIGHTED, ids=lambda p: p.relative_to(REPO).as_posix())
def test_the_grammar_and_the_parsers_lexer_agree_on_every_token(path: Path):
    lark = _lexer()
    by_line: dict[int, list[tuple[int, int, list[str]]]] = {}
    for line, start, end, scopes in _code_point_tokens(path):
        by_line.setdefault(line, []).append((start, end, scopes))
    problems = []
    for token in lark.lex(path.read_text(encoding="utf-8"), dont_ignore=True):
        if token.type.startswith("__IGNORE"):
            continue
        category = _category(lark, token.type)
        first, last = token.column - 1, token.column - 1 + len(token.value)
        for start, end, scopes in by_line[token.line]:
            if end > first and start < last and not scopes[-1].startswith(_EXPECTED[category]):
                problems.append(
                    f"{token.line}:{token.column} {token.value!r} is a {category} to the parser, {scopes[-1]} to the grammar"
                )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", FIXTURES + SNAPSHOTS, ids=lambda p: p.relative_to(EDITOR).as_posix())
def test_grammar_fixtures_are_valid_programs(path: Path):
    result = check_file(path)
    assert result.ok, [d.message for d in result.diagnostics]


def test_the_snapshots_cover_the_current_examples():
    copies = {p.stem: p.read_text(encoding="utf-8") for p in SNAPSHOTS}
    examples = {p.parent.name: p.read_text(encoding="utf-8") for p in EXAMPLES}
    assert copies == examples, "the examples changed: run `make editor-snapshots` and review the snapshot diff"
