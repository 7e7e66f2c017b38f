"""The text embedder: one unit vector per sequence of token ids, batches that agree with single
calls (padding masked out), order-sensitive, and clear errors for ids it cannot take."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install 'flowc[models]'")

from flowstd.models import ModelInputError, TextEmbedder, TextEmbedderConfig  # noqa: E402 - after the skip

IDS = [12, 7, 4000, 99, 1, 1, 250]


@pytest.fixture(scope="module")
def embedder():
    return TextEmbedder()


def test_one_unit_vector_per_sequence(embedder):
    vector = embedder.embed(IDS)
    assert vector.shape == (128,) and vector.dtype == torch.float32
    assert float(vector.norm()) == pytest.approx(1.0, abs=1e-6)
    assert embedder.embed([3]).shape == (128,)
    assert embedder.embed(list(range(512))).shape == (128,)


def test_lists_tensors_and_numpy_ids_are_the_same(embedder):
    expected = embedder.embed(IDS)
    assert torch.equal(embedder.embed(torch.tensor(IDS, dtype=torch.int32)), expected)
    assert torch.equal(embedder.embed(np.array(IDS, dtype=np.int16)), expected)


def test_order_and_content_matter(embedder):
    vector = embedder.embed(IDS)
    assert not torch.allclose(embedder.embed(IDS[::-1]), vector)
    assert not torch.allclose(embedder.embed([*IDS[:-1], 251]), vector)
    assert float(vector @ embedder.embed(IDS)) == pytest.approx(1.0, abs=1e-6)  # cosine similarity is the dot product


def test_a_batch_row_is_its_sequence_alone_padding_masked(embedder):
    sequences = [IDS, [5], list(range(100, 140))]
    batch = embedder.embed_batch(sequences)
    assert batch.shape == (3, 128)
    for row, ids in zip(batch, sequences, strict=True):
        assert torch.allclose(row, embedder.embed(ids), atol=1e-5)


def test_projection_to_an_output_width():
    embedder = TextEmbedder(TextEmbedderConfig(vocab_size=300, hidden=32, heads=2, depth=1, output_dim=16))
    vector = embedder.embed([1, 2, 299])
    assert vector.shape == (16,) and float(vector.norm()) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(
    ("ids", "words"),
    [
        ([], "got 0 ids"),
        (list(range(513)), "at most 512 token ids"),
        ([1, -2, 3], "must be in [0, 8192); got ids from -2 to 3"),
        ([8192], "got ids from 8192 to 8192"),
        ([1.0, 2.0], "the list holds a non-int"),
        ([True, 2], "the list holds a non-int"),
        (torch.tensor([1.0, 2.0]), "got float32 (2,)"),
        (torch.zeros(2, 3, dtype=torch.int64), "got int64 (2, 3)"),
        ("hello", "token ids must be a non-empty list or 1-D integer array of at most 512 token ids in [0, 8192); got str"),
    ],
)
def test_ids_it_cannot_take_are_refused_with_the_expected_form(embedder, ids, words):
    with pytest.raises(ModelInputError) as error:
        embedder.embed(ids)
    assert words in str(error.value)


def test_embed_batch_takes_a_non_empty_list(embedder):
    for bad in ([], torch.zeros(2, 3, dtype=torch.int64), "ids"):
        with pytest.raises(ModelInputError, match="embed_batch takes a non-empty list"):
            embedder.embed_batch(bad)
