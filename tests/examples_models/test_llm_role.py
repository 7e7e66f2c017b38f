"""flowstd.roles.llm's checks, without a server: a `global kv` the model cannot take is refused
naming the setting; request parameters become sampling settings, bad ones are refused naming
the parameter; token ids outside the vocabulary are refused."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the llm role runs flowrt's reference engine: pip install 'flowc[torch]'")

from flowrt.params.layout import KVLayout  # noqa: E402
from flowstd.roles.llm import DEFAULT_MAX_TOKENS, LlmError, model_config, sampling_request, token_ids  # noqa: E402


def layout(**changes) -> KVLayout:
    settings = {"sub_names": ("0", "1"), "slice_names": ("k", "v"), "heads": 2, "head_dim": 16, "dtype": "float32"}
    settings.update(changes)
    return KVLayout(
        "kv", settings["sub_names"], settings["slice_names"], 16, settings["heads"], settings["head_dim"], settings["dtype"]
    )


def test_the_global_sizes_the_model():
    config = model_config(layout(heads=3, head_dim=8, sub_names=("0", "1", "2")), 3072)
    assert (config.num_layers, config.num_kv_heads, config.num_heads, config.head_dim) == (3, 3, 6, 8)
    assert config.vocab_size == 3072 and config.kv_dtype == "float32"


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"slice_names": ("k",)}, "`slices [k, v]`"),
        ({"head_dim": 1}, "an even `head_dim`"),
        ({"dtype": "int8"}, "`dtype` to one of float32"),
    ],
)
def test_a_global_the_model_cannot_take_is_refused_naming_the_setting(changes, words):
    with pytest.raises(LlmError, match="global `kv` cannot hold the llm role's K/V") as raised:
        model_config(layout(**changes), 3072)
    assert words in str(raised.value)


def test_request_parameters_become_sampling_settings():
    assert sampling_request([{"role": "user", "content": "hi"}]) == (sampling_request({})[0], DEFAULT_MAX_TOKENS)
    params, budget = sampling_request({"temperature": 0.7, "top_p": 0.9, "seed": 3, "max_tokens": 9, "max_completion_tokens": 5})
    assert (params.temperature, params.top_p, params.seed, budget) == (0.7, 0.9, 3, 5)  # max_completion_tokens counts
    for request, words in (
        ({"temperature": 3}, "temperature must be a number from 0 to 2"),
        ({"top_p": 0}, "top_p is 0"),
        ({"seed": -1}, "seed must be a whole number from 0 to 2\\*\\*63 - 1"),
        ({"seed": 2**64}, "seed must be a whole number from 0 to 2\\*\\*63 - 1"),
        ({"max_tokens": 0}, "max_completion_tokens / max_tokens must be a whole number >= 1"),
    ):
        with pytest.raises(LlmError, match=words):
            sampling_request(request)


def test_token_ids_outside_the_vocabulary_are_refused():
    assert token_ids([1, 2, 3], "chat_tokens", 10) == [1, 2, 3]
    with pytest.raises(LlmError, match="chat_tokens holds 10, outside the vocabulary of 10 tokens"):
        token_ids([1, 10], "chat_tokens", 10)
    with pytest.raises(LlmError, match="non-empty list"):
        token_ids([], "chat_tokens", 10)
