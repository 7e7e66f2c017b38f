# flowc: set-up, tests and the main job. Every target installs what it needs first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
EXAMPLES := $(sort $(wildcard examples/*/pipeline.flow))
EDITOR := editors/vscode
NODE_STAMP := $(EDITOR)/node_modules/.installed-stamp

.PHONY: all install demo test golden docs lint bench bench-overhead editor editor-grammar editor-snapshots clean

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

## Node tools of the VS Code extension (grammar tests, packaging), exactly as the lockfile pins them.
$(NODE_STAMP): $(EDITOR)/package-lock.json
	cd $(EDITOR) && npm ci --no-audit --no-fund
	touch $(NODE_STAMP)

install: $(STAMP) $(NODE_STAMP)

## The main job: check, format-check and plan every example; build image_chat and run one call on the embedded runtime.
demo: $(STAMP)
	$(VENV)/bin/flowc check $(EXAMPLES)
	$(VENV)/bin/flowc fmt --check $(EXAMPLES)
	$(VENV)/bin/flowc plan examples/image_chat/pipeline.flow
	$(VENV)/bin/flowc build examples/image_chat/pipeline.flow -o build/image_chat
	cd build && ../$(PY) -m image_chat check
	$(VENV)/bin/flowc run build/image_chat --once chat --input @examples/image_chat/request.json

## The tests (CI runs exactly this): lint, the editor grammar's own tests (npm), then pytest.
test: $(STAMP) $(NODE_STAMP)
	$(PY) -m ruff check compiler runtime stdlib tests bench examples editors
	cd $(EDITOR) && npm test
	$(PY) -m pytest

## Rewrite the golden files under golden/ after an intended change; review the diff like code.
golden: $(STAMP)
	$(PY) -m pytest --snapshot-update tests

## Regenerate docs/diagnostics.md from the check registry.
docs: $(STAMP)
	$(PY) -m flowc.check.catalog > docs/diagnostics.md

lint: $(STAMP)
	$(PY) -m ruff check compiler runtime stdlib tests bench examples editors
	$(PY) -m ruff format --check compiler runtime stdlib tests bench examples editors

bench: $(STAMP)
	$(PY) bench/compile_bench.py
	$(PY) bench/fuzz_bench.py

## Control-flow overhead against a hand-written floor and LangGraph (installed here only, in .venv-bench).
bench-overhead:
	$(PYTHON) -m venv .venv-bench
	.venv-bench/bin/python -m pip install --quiet --disable-pip-version-check -e . langgraph
	.venv-bench/bin/python bench/control_overhead.py --profile

## The VS Code extension as build/flowc.vsix (install: code --install-extension build/flowc.vsix).
editor: $(STAMP) $(NODE_STAMP)
	$(PY) $(EDITOR)/scripts/build_grammar.py --check
	mkdir -p build
	cd $(EDITOR) && npm run package

## Regenerate the editor grammar's JSON from grammars/flow.tmLanguage.yaml.
editor-grammar: $(STAMP)
	$(PY) $(EDITOR)/scripts/build_grammar.py

## Refresh the token snapshots of the examples after an intended grammar change; review the diff.
editor-snapshots: $(NODE_STAMP)
	for example in $(EXAMPLES); do cp $$example $(EDITOR)/tests/snap/$$(basename $$(dirname $$example)).flow; done
	cd $(EDITOR) && npx vscode-tmgrammar-snap --updateSnapshot --grammar syntaxes/flow.tmLanguage.json "tests/snap/*.flow"

clean:
	rm -rf $(VENV) .venv-bench build *.egg-info .pytest_cache .hypothesis $(EDITOR)/node_modules
