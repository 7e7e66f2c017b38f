# flowc: set-up, tests and the main job. Every target installs what it needs first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
EXAMPLES := $(sort $(wildcard examples/*/pipeline.flow))
EDITOR := editors/vscode
NODE_STAMP := $(EDITOR)/node_modules/.installed-stamp
# the compiled control core: the modules with a .pxd beside them (docs/runtime.md, "The compiled core")
CORE_PXD := $(wildcard runtime/flowrt/control/*.pxd)
CORE_SOURCES := $(CORE_PXD) $(CORE_PXD:.pxd=.py) runtime/flowrt/control/native.py setup.py \
	$(wildcard runtime/flowrt/compute/_pagehash.pyx runtime/flowrt/compute/*.h) runtime/flowrt/compute/native.py \
	runtime/flowrt/observe/_tracewriter.pyx runtime/flowrt/observe/_tracetext.h runtime/flowrt/extensions.py
CORE_STAMP := $(VENV)/.core-stamp
# Python 3.12+ starts activations as eager tasks (docs/runtime.md); where one is installed,
# `make test` runs the runtime suites under it too, so both launch paths are tested
# (pyenv installs them without putting them on PATH: its versions are tried too)
EAGER_PYTHON ?= $(shell for p in python3.12 python3.13 $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.1[2-9]*/bin/python3 2>/dev/null); \
	do $$p -c 'import sys; assert sys.version_info >= (3, 12); print(sys.executable)' 2>/dev/null && break; done)
EAGER_VENV ?= .venv-eager
EAGER_STAMP := $(EAGER_VENV)/.installed-stamp
EAGER_CORE_STAMP := $(EAGER_VENV)/.core-stamp
# the interpreter of `make bench-overhead` (all three systems run on it)
BENCH_PYTHON ?= $(PYTHON)
BENCH_VENV ?= .venv-bench

.PHONY: all install core demo test test-pure test-eager golden docs lint bench bench-overhead editor editor-grammar editor-snapshots clean

all: test

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: the data plane's tensors (flowc[torch]); a looser spec would pull a CUDA build
	$(PY) -m pip install --quiet --disable-pip-version-check 'torch==2.13.0'
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,models]'
	touch $(STAMP) $(CORE_STAMP)

## The compiled control core, rebuilt in place when its sources change (the install builds it too;
## FRESH_CORE asks flowrt whether the extensions beside the sources were built from them).
FRESH_CORE = -W ignore -c "import sys; from flowrt.control import native; from flowrt.extensions import EXTENSIONS; sys.exit(not (native.choose()[0] and all(each.load()[0] for each in EXTENSIONS)))"
$(CORE_STAMP): $(CORE_SOURCES) | $(STAMP)
	$(PY) $(FRESH_CORE) || $(PY) setup.py --quiet build_ext --inplace --parallel 2
	touch $(CORE_STAMP)

core: $(CORE_STAMP)

## Node tools of the VS Code extension (grammar tests, packaging), exactly as the lockfile pins them.
$(NODE_STAMP): $(EDITOR)/package-lock.json
	cd $(EDITOR) && npm ci --no-audit --no-fund
	touch $(NODE_STAMP)

install: $(CORE_STAMP) $(NODE_STAMP)

## The main job: check, format-check and plan every example; build image_chat and run one call on the embedded runtime.
demo: $(CORE_STAMP)
	$(VENV)/bin/flowc check $(EXAMPLES)
	$(VENV)/bin/flowc fmt --check $(EXAMPLES)
	$(VENV)/bin/flowc plan examples/image_chat/pipeline.flow
	$(VENV)/bin/flowc build examples/image_chat/pipeline.flow -o build/image_chat
	cd build && ../$(PY) -m image_chat check
	$(VENV)/bin/flowc run build/image_chat --once chat --input @examples/image_chat/request.json

## The tests (CI runs exactly this): lint, the editor grammar's own tests (npm), pytest (on the
## compiled core), the runtime suites again on the core's Python sources, then under Python 3.12+
## where one is installed.
test: $(CORE_STAMP) $(NODE_STAMP)
	$(PY) -m ruff check compiler runtime stdlib tests bench examples editors
	cd $(EDITOR) && npm test
	$(PY) -m pytest
	$(MAKE) --no-print-directory test-pure
	$(MAKE) --no-print-directory test-eager

## The runtime and example suites on the control core's Python sources (the specification of the compiled one).
test-pure: $(CORE_STAMP)
	FLOWRT_PURE=1 $(PY) -m pytest tests/runtime tests/test_examples.py

$(EAGER_STAMP): pyproject.toml setup.py
	$(EAGER_PYTHON) -m venv $(EAGER_VENV)
	$(EAGER_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(EAGER_STAMP) $(EAGER_CORE_STAMP)

$(EAGER_CORE_STAMP): $(CORE_SOURCES) | $(EAGER_STAMP)
	$(EAGER_VENV)/bin/python $(FRESH_CORE) || $(EAGER_VENV)/bin/python setup.py --quiet build_ext --inplace --parallel 2
	touch $(EAGER_CORE_STAMP)

## The runtime, property and example suites on the eager launch path (Python 3.12+), if installed.
ifeq ($(strip $(EAGER_PYTHON)),)
test-eager:
	@echo "test-eager: no python3.12 or python3.13 here; the eager launch path is not tested"
else
test-eager: $(EAGER_CORE_STAMP)
	$(EAGER_VENV)/bin/python -m pytest tests/runtime tests/property tests/test_examples.py
endif

## Rewrite the golden files under golden/ after an intended change; review the diff like code.
golden: $(CORE_STAMP)
	$(PY) -m pytest --snapshot-update tests

## Regenerate docs/diagnostics.md from the check registry.
docs: $(STAMP)
	$(PY) -m flowc.check.catalog > docs/diagnostics.md

lint: $(STAMP)
	$(PY) -m ruff check compiler runtime stdlib tests bench examples editors
	$(PY) -m ruff format --check compiler runtime stdlib tests bench examples editors

bench: $(CORE_STAMP)
	$(PY) bench/compile_bench.py
	$(PY) bench/fuzz_bench.py

## Control-flow overhead against a hand-written floor and LangGraph (installed here only, in .venv-bench).
## BENCH_PYTHON=/path/to/python3.12 BENCH_VENV=.venv-bench-3.12 measures on the eager launch path.
bench-overhead:
	$(BENCH_PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e . langgraph
	$(BENCH_VENV)/bin/python bench/control_overhead.py --profile

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
	rm -rf $(VENV) $(EAGER_VENV) .venv-bench* build *.egg-info .pytest_cache .hypothesis $(EDITOR)/node_modules
	rm -f runtime/flowrt/control/*.so runtime/flowrt/control/_native_build.json
