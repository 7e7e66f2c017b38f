"""Imports: beside the file, dotted paths, the standard library, and what they bring in."""

from __future__ import annotations

from flowc.check import check_file

LIB = """flow lib

placeholder text: Text

role shout {
    impl "lib:Shout"
    interface run { in text  out loud: Text }
}

role unfed {
    impl "lib:Unfed"
    interface run { in nothing_feeds_this  out never: Text }
}

graph only_in_lib {
    entry  text
    return loud
}
"""

MAIN = """flow main

import lib

role echo {
    impl "main:Echo"
    interface run { in loud  out echoed: Text }
}

graph g {
    entry  text
    return echoed
}
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def codes(result):
    return [d.code for d in result.diagnostics]


def test_import_beside_the_file_brings_roles_and_placeholders(tmp_path):
    write(tmp_path, "lib.flow", LIB)
    result = check_file(write(tmp_path, "main.flow", MAIN), "main.flow")
    assert result.ok, codes(result)
    program = result.program
    assert set(program.roles) == {"shout", "unfed", "echo"}
    assert "text" in program.placeholders
    # graphs are not imported; only the root module's graphs are callable
    assert set(program.graphs) == {"g"}
    assert program.field("loud").producers[0].role == "shout"


def test_unfed_imported_role_is_not_an_error(tmp_path):
    write(tmp_path, "lib.flow", LIB)
    result = check_file(write(tmp_path, "main.flow", MAIN), "main.flow")
    assert "E140" not in codes(result)


def test_dotted_import(tmp_path):
    write(tmp_path, "pkg/lib.flow", LIB)
    result = check_file(write(tmp_path, "main.flow", MAIN.replace("import lib", "import pkg.lib")), "main.flow")
    assert result.ok, codes(result)
    assert result.program.modules[0].path == "pkg/lib.flow"


def test_standard_library_import(tmp_path):
    text = """import text

role upper {
    impl "m:Upper"
    interface run { in prompt_tokens  out shouted: Tokens }
}

graph g {
    entry  prompt
    return shouted
}
"""
    result = check_file(write(tmp_path, "main.flow", text), "main.flow")
    assert result.ok, codes(result)
    assert result.program.roles["tokenizer"].module == "text"
    assert "<stdlib>/text.flow" in result.sources


def test_a_file_beside_shadows_the_standard_library(tmp_path):
    write(tmp_path, "text.flow", LIB)
    result = check_file(write(tmp_path, "main.flow", MAIN.replace("import lib", "import text")), "main.flow")
    assert result.ok, codes(result)
    assert "tokenizer" not in result.program.roles


def test_duplicate_between_import_and_root_is_reported_in_the_root(tmp_path):
    write(tmp_path, "lib.flow", LIB)
    main = MAIN.replace("role echo", "role shout")
    result = check_file(write(tmp_path, "main.flow", main), "main.flow")
    (dup,) = [d for d in result.diagnostics if d.code == "E110"]
    assert dup.span.file == "main.flow"
    assert dup.notes[0].span.file == "lib.flow"


def test_each_module_is_loaded_once(tmp_path):
    write(tmp_path, "base.flow", "placeholder text: Text\n")
    write(tmp_path, "left.flow", "import base\n")
    write(tmp_path, "right.flow", "import base\n")
    main = 'import left\nimport right\n\nrole r {\n    impl "m:R"\n    interface run { in text  out t2: Text }\n}\n\ngraph g {\n    entry  text\n    return t2\n}\n'
    result = check_file(write(tmp_path, "main.flow", main), "main.flow")
    assert result.ok, codes(result)
    assert [m.path for m in result.program.modules] == ["base.flow", "left.flow", "right.flow", "main.flow"]


def test_unreadable_import_is_reported(tmp_path):
    (tmp_path / "broken.flow").write_bytes(b"placeholder \xff\xfe: Json\n")
    result = check_file(write(tmp_path, "main.flow", "import broken\n"), "main.flow")
    assert codes(result) == ["E103"]
    assert result.diagnostics[0].span.file == "main.flow"


def test_syntax_error_in_an_import_is_reported_in_that_file(tmp_path):
    write(tmp_path, "lib.flow", "role {\n")
    result = check_file(write(tmp_path, "main.flow", MAIN), "main.flow")
    assert codes(result) == ["E001"]
    assert result.diagnostics[0].span.file == "lib.flow"
    assert result.program is None


def test_import_of_a_name_too_long_for_the_file_system(tmp_path):
    # found by bench/fuzz_bench.py: Path.is_file() raises OSError for such names
    result = check_file(write(tmp_path, "main.flow", f"import {'a' * 5000}\n"), "main.flow")
    assert codes(result) == ["E101"]
