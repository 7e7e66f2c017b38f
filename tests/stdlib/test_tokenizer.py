"""flowstd's byte-level BPE tokenizer: loading, exact round trips, decoding as `tokenizers` does,
clear errors for bad input, and a clear message where `tokenizers` is not installed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("tokenizers", reason="the flowstd tokenizer needs `tokenizers`: pip install 'flowc[models]'")

from flowstd.tokenizer import SPECIAL_TOKENS, Tokenizer, TokenizerError, TokenizerUnavailable  # noqa: E402
from flowstd.tokenizer.core import bytes_to_unicode, default_path  # noqa: E402
from tests.conftest import REPO  # noqa: E402

TOKENIZER = Tokenizer.load()
SPECIALS = st.sampled_from(SPECIAL_TOKENS)
# any well-formed text, with the chat template's markers spliced in (they must stay plain text)
TEXTS = st.one_of(
    st.text(),
    st.lists(st.one_of(st.text(max_size=8), SPECIALS), max_size=8).map("".join),
)
IDS = st.lists(st.integers(0, TOKENIZER.vocab_size - 1), max_size=24)


def test_load_gives_one_shared_tokenizer_with_the_documented_vocabulary():
    assert Tokenizer.load() is TOKENIZER
    assert Tokenizer.load(default_path()) is TOKENIZER
    assert TOKENIZER.vocab_size == 3072
    assert dict(TOKENIZER.special_ids) == {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    assert (TOKENIZER.pad_id, TOKENIZER.bos_id, TOKENIZER.eos_id) == (0, 1, 2)
    assert (TOKENIZER.system_id, TOKENIZER.user_id, TOKENIZER.assistant_id) == (3, 4, 5)
    assert (TOKENIZER.image_id, TOKENIZER.audio_id) == (6, 7)
    # every byte has a token of its own (ids 8-263), so no text is ever out of vocabulary
    assert sorted(TOKENIZER.token_bytes_table[8:264]) == [bytes([b]) for b in range(256)]


def test_the_vocabulary_learned_the_repositorys_words():
    # merges trained on the docs: their words cost far fewer tokens than bytes
    sentence = "flowc build pipeline.flow emits a bundle: the static plan and deployment manifests"
    ids = TOKENIZER.encode(sentence)
    assert len(ids) * 4 < len(sentence.encode())
    assert TOKENIZER.token_bytes(TOKENIZER.encode(" pipeline")[0]) == b" pipeline"


@settings(max_examples=300, deadline=None)
@given(TEXTS)
def test_decode_of_encode_is_the_text_for_any_string(text):
    ids = TOKENIZER.encode(text)
    assert TOKENIZER.decode(ids) == text
    assert TOKENIZER.decode(ids, skip_special_tokens=False) == text
    assert not set(ids) & TOKENIZER.special_id_set  # plain text never becomes a marker


@settings(max_examples=200, deadline=None)
@given(IDS, st.booleans())
def test_decode_reads_any_ids_exactly_as_tokenizers_does(ids, skip):
    # invalid UTF-8 included: one U+FFFD per malformed sequence, as Rust's from_utf8_lossy
    backend = TOKENIZER._backend
    assert TOKENIZER.decode(ids, skip_special_tokens=skip) == backend.decode(ids, skip_special_tokens=skip)


def test_the_byte_alphabet_is_the_one_tokenizers_uses():
    from tokenizers.pre_tokenizers import ByteLevel

    assert sorted(bytes_to_unicode().values()) == sorted(ByteLevel.alphabet())


def test_markers_in_text_are_spelled_out_and_edge_cases_round_trip():
    for text in [
        "",
        "<|user|>",
        "<|eos|><|bos|>",
        "\x00",
        "\r\n\t  \u2028",
        "é" * 300,
        "🎉🇫🇷👩‍👩‍👧",
        "日本語のテキスト",
        "a" * 5000,
    ]:
        assert TOKENIZER.decode(TOKENIZER.encode(text)) == text
    assert TOKENIZER.encode("") == []
    assert TOKENIZER.encode_batch(["a red cat", "🎉", ""]) == [TOKENIZER.encode(t) for t in ["a red cat", "🎉", ""]]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: TOKENIZER.encode(b"bytes"), "must be a string, not bytes"),
        (lambda: TOKENIZER.encode(None), "must be a string, not NoneType"),
        (lambda: TOKENIZER.encode("ok \ud800 no"), "lone surrogate U+D800 at character 3"),
        (lambda: TOKENIZER.encode_batch(["ok", 3]), "text 1 must be a string"),
        (lambda: TOKENIZER.decode([5, 3072]), "token ids[1] is 3072, outside the vocabulary (0 to 3071)"),
        (lambda: TOKENIZER.decode([-1]), "token ids[0] is -1, outside the vocabulary"),
        (lambda: TOKENIZER.decode([True]), "must be an integer, not a boolean"),
        (lambda: TOKENIZER.decode([1.0]), "must be an integer, not float"),
        (lambda: TOKENIZER.decode("abc"), "must be a list of integers, not str"),
        (lambda: TOKENIZER.token_bytes(99999), "outside the vocabulary"),
    ],
)
def test_bad_input_gets_a_clear_error(call, message):
    with pytest.raises(TokenizerError) as error:
        call()
    assert message in str(error.value)


def test_a_missing_or_foreign_vocabulary_file_is_named(tmp_path):
    with pytest.raises(TokenizerUnavailable, match=r"no tokenizer file at .*python -m flowstd.tokenizer.train"):
        Tokenizer.load(tmp_path / "absent.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(TokenizerUnavailable, match="is not a tokenizer file tokenizers can read"):
        Tokenizer.load(broken)
    foreign = json.loads(default_path().read_text())
    foreign["added_tokens"] = [t for t in foreign["added_tokens"] if t["content"] != "<|audio|>"]
    del foreign["model"]["vocab"]["<|audio|>"]
    with pytest.raises(TokenizerUnavailable, match=r"not a flowstd tokenizer: it has no special token <\|audio\|>"):
        Tokenizer.from_json(json.dumps(foreign), "foreign.json")


WITHOUT_TOKENIZERS = """
import sys
sys.modules["tokenizers"] = None   # as if not installed
sys.modules["torch"] = None        # flowstd's text roles never need torch
import flowstd.roles.tokenizer     # importing needs neither
from flowstd.tokenizer import Tokenizer, TokenizerUnavailable
try:
    Tokenizer.load()
except TokenizerUnavailable as error:
    print(error)
"""


def test_without_tokenizers_the_package_imports_and_loading_names_the_install():
    result = subprocess.run([sys.executable, "-c", WITHOUT_TOKENIZERS], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "the flowstd tokenizer needs Hugging Face `tokenizers`, which is not installed: pip install 'flowc[models]'"
    )
