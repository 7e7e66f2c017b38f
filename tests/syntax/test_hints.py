"""Syntax-error hints name the actual problem (issue 12, item 17): each row is a mistake whose
hint used to mislead (a keyword after a comma blamed as a reserved word, every `-` taken for a
negative number, every `/` for a comment) or said nothing useful, with the hint it gets now."""

from __future__ import annotations

import pytest

from flowc.syntax import parse

GRAPH_HEAD = 'placeholder audio: Audio\nrole r {\n    impl "m:R"\n    interface i { in audio  out y: Json }\n}\n'

# (name, source, code, text the message holds, the hint exactly)
CASES = [
    (
        "comma between graph clauses",
        GRAPH_HEAD + "graph g {\n    entry audio, stream y\n}\n",
        "E001",
        "unexpected `stream` in `graph g`",
        "remove the `,` before `stream`: a comma continues the list of the clause before it; "
        "clauses and settings are separated by newlines or spaces",
    ),
    (
        "trailing comma at the end of a line",
        GRAPH_HEAD + "graph g {\n    entry audio,\n    return y\n}\n",
        "E001",
        "unexpected `return`",
        "remove the `,` before `return`: a comma continues the list of the clause before it; "
        "clauses and settings are separated by newlines or spaces",
    ),
    (
        "comma between role settings",
        'role r {\n    impl "m:R",\n    replicas 2\n}\n',
        "E001",
        "unexpected number `2` in `role r`; expected `,`, `allow`, `interface`, `share`, `}` or a name",
        "`replicas` was read as one more value of the setting before it, because of the `,` before `replicas`: "
        "settings are separated by newlines or spaces, not commas; remove the `,`",
    ),
    (
        "comma between role settings after another declaration",
        'flow t\n\nplaceholder x: Json\n\nrole r {\n    impl "m:R",\n    replicas 2\n}\n',
        "E001",
        "unexpected number `2` in `role r`",
        "`replicas` was read as one more value of the setting before it, because of the `,` before `replicas`: "
        "settings are separated by newlines or spaces, not commas; remove the `,`",
    ),
    (
        "dangling &",
        'placeholder a: Json\nrole r {\n    impl "m:R"\n    interface i {\n        in a &\n        out y: Json\n    }\n}\n',
        "E001",
        "unexpected `out`",
        "nothing follows the `&` before `out`: add the field, or remove the `&`",
    ),
    (
        "dangling |",
        'placeholder a: Json\nrole r {\n    impl "m:R"\n    interface i {\n        in a |\n        out y: Json\n    }\n}\n',
        "E001",
        "unexpected `out`",
        "nothing follows the `|` before `out`: add the alternative, or remove the `|`",
    ),
    (
        "entry without names",
        "graph g {\n    entry\n    stream y\n}\n",
        "E001",
        "unexpected `stream`",
        "`entry` needs one or more placeholder names after it, before `stream`",
    ),
    # issue 33: docs/language.md says a comma continues the clause before it; `stream` takes one field
    (
        "two ordered streams in one stream clause",
        GRAPH_HEAD + "graph g {\n    entry  audio\n    stream y ordered, z ordered\n}\n",
        "E001",
        "unexpected `,` in `graph g`",
        "each `stream` clause takes one field: remove the `,` and write `stream z ordered` on a line of its own",
    ),
    (
        "two streams in one stream clause",
        GRAPH_HEAD + "graph g {\n    entry audio stream y: Json, z\n}\n",
        "E001",
        "unexpected `,` in `graph g`",
        "each `stream` clause takes one field: remove the `,` and write `stream z` on a line of its own",
    ),
    (
        "comma in an in clause",
        'role r {\n    impl "m:R"\n    interface i { in a, b  out y: Json }\n}\n',
        "E001",
        "unexpected `,`",
        "an `in` clause joins fields with `&` (all of them) or `|` (any of them), not `,`",
    ),
    (
        "= in a setting",
        "role r {\n    replicas = 2\n}\n",
        "E001",
        "unexpected `=`",
        "settings take no `=`: write `replicas VALUE`",
    ),
    # a keyword meant as a name keeps the reserved-word hint
    (
        "keyword as a role name",
        "role stream {\n}\n",
        "E001",
        "unexpected `stream`",
        "`stream` is a reserved word; choose another name",
    ),
    (
        "keyword as an output name",
        "role r {\n    interface i { in a  out x: Json, stream: Json }\n}\n",
        "E001",
        "unexpected `stream`",
        "`stream` is a reserved word; choose another name",
    ),
    (
        "keyword as a placeholder",
        "placeholder stream: Json\n",
        "E001",
        "unexpected `stream`",
        "`stream` is a reserved word; choose another name "
        "(a placeholder whose values stream is declared `placeholder stream NAME: TYPE`)",
    ),
    (
        "keyword as a streaming placeholder's name",
        "placeholder stream stream: Json\n",
        "E001",
        "unexpected `stream`",
        "`stream` is a reserved word; choose another name",
    ),
    # characters
    (
        "- inside a name",
        "role my-role {\n}\n",
        "E003",
        "unexpected character `-`",
        "names hold ASCII letters, digits and `_`, not `-`: use `_`",
    ),
    (
        "a negative number",
        "role r {\n    replicas -1\n}\n",
        "E003",
        "unexpected character `-`",
        "numbers in .flow files are never negative",
    ),
    ("a lone /", 'role r {\n    impl "m:R"\n} / 2\n', "E003", "unexpected character `/`", None),
    (
        "// comment",
        "// a comment\n",
        "E003",
        "unexpected character `/`",
        "comments start with `#` and run to the end of the line",
    ),
    (
        "non-ASCII letter in a name",
        "role écho {\n}\n",
        "E003",
        "unexpected character `é`",
        "names hold ASCII letters, digits and `_`; `é` may appear only in strings and comments",
    ),
    (
        "zero-width space",
        "role r\u200b {\n}\n",
        "E003",
        "unexpected character U+200B (invisible)",
        "delete the invisible character U+200B (copied from a web page or a word processor?)",
    ),
    (
        "a byte-order mark inside the file",
        "flow t\n\ufeffrole r {\n}\n",
        "E003",
        "unexpected character U+FEFF (invisible)",
        "remove the invisible byte-order mark: it is allowed only at the very start of the file",
    ),
]


@pytest.mark.parametrize(("name", "source", "code", "message", "hint"), CASES, ids=[c[0] for c in CASES])
def test_syntax_hints_name_the_actual_problem(name, source, code, message, hint):
    result = parse(source, "t.flow")
    assert result.module is None
    first = result.diagnostics[0]
    assert first.code == code
    assert message in first.message
    assert first.hint == hint


def test_expected_words_offer_only_what_the_block_takes():
    # the LALR state after a setting is shared by roles, interfaces and graphs: a role is not
    # offered `entry` or `return`, a graph not `interface`, and nobody `]` outside a list
    role = parse('role r {\n    impl "m:R" 5\n}\n').diagnostics[0].message
    assert "`entry`" not in role and "`return`" not in role and "`]`" not in role and "`interface`" in role
    graph = parse("graph g {\n    timeout 5s 5\n}\n").diagnostics[0].message
    assert "`interface`" not in graph and "`entry`" in graph
    # after `out`, `stream` is still offered
    assert "`stream`" in parse("role r {\n    interface i { in a out }\n}\n").diagnostics[0].message
