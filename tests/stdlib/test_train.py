"""The shipped vocabulary is what its script trains from the committed corpus, byte for byte."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tokenizers", reason="the flowstd tokenizer needs `tokenizers`: pip install 'flowc[models]'")

from flowstd.tokenizer import train  # noqa: E402
from flowstd.tokenizer.core import default_path  # noqa: E402


@pytest.fixture(scope="module")
def retrained() -> str:
    return train.train(train.CORPUS.read_text(encoding="utf-8"))


def test_retraining_gives_the_same_vocabulary_and_merges(retrained):
    shipped, fresh = json.loads(default_path().read_text(encoding="utf-8")), json.loads(retrained)
    assert fresh["model"]["vocab"] == shipped["model"]["vocab"]
    assert fresh["model"]["merges"] == shipped["model"]["merges"]
    assert fresh["added_tokens"] == shipped["added_tokens"]
    assert len(fresh["model"]["vocab"]) == train.VOCAB_SIZE


def test_retraining_gives_the_shipped_file_byte_for_byte(retrained):
    assert retrained == default_path().read_text(encoding="utf-8"), (
        "run `python -m flowstd.tokenizer.train` and commit the result"
    )


def test_the_script_checks_and_writes(tmp_path, capsys):
    assert train.main(["--check"]) == 0
    stale = tmp_path / "tokenizer.json"
    stale.write_text("{}")
    assert train.main(["--check", "--output", str(stale)]) == 1
    assert "differs from a retrain" in capsys.readouterr().out
    assert train.main(["--output", str(stale)]) == 0
    assert stale.read_bytes() == default_path().read_bytes()
    assert train.main(["--corpus", str(tmp_path / "none.txt")]) == 2
    assert "no corpus at" in capsys.readouterr().err


def test_a_corpus_snapshot_joins_the_sources_in_order(tmp_path):
    for name, text in {"README.md": "# read me\n", "docs/b.md": "bee\n", "docs/a.md": "ay\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    with pytest.raises(FileNotFoundError, match="has no examples/\\*/README.md"):
        train.assemble_corpus(tmp_path)
    for name in ("examples/x/README.md", "examples/x/pipeline.flow", "stdlib/flowstd/lib/m.flow"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name + "\n")
    expected = "# read me\n\nay\n\nbee\n\nexamples/x/README.md\n\nexamples/x/pipeline.flow\n\nstdlib/flowstd/lib/m.flow\n"
    assert train.assemble_corpus(tmp_path) == expected
