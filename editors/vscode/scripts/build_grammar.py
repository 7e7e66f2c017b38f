"""Generate syntaxes/flow.tmLanguage.json from grammars/flow.tmLanguage.yaml (the readable source).

    python editors/vscode/scripts/build_grammar.py          # write the JSON
    python editors/vscode/scripts/build_grammar.py --check  # exit 1 if the JSON is stale

The output is deterministic (key order as written, two-space indent, trailing newline), so the
committed JSON changes exactly when the YAML does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
SOURCE = REPO / "grammars" / "flow.tmLanguage.yaml"
TARGET = REPO / "editors" / "vscode" / "syntaxes" / "flow.tmLanguage.json"
NOTICE = "Generated from grammars/flow.tmLanguage.yaml by editors/vscode/scripts/build_grammar.py; edit the YAML, not this file."


def render() -> str:
    grammar = yaml.safe_load(SOURCE.read_text(encoding="utf-8"))
    return json.dumps({"information_for_contributors": [NOTICE], **grammar}, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current != text:
            print(f"{TARGET.relative_to(REPO)} is stale: run `make editor-grammar` and commit the result", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
