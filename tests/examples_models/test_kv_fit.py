"""flowstd's LLM roles check in `setup` that the pool of `global kv` fits their model: a global of
another shape stops the deployment from starting (inproc and local), with an error naming the
global's shape, the model's and the setting to change, instead of failing at the first call.
The global is changed the documented way: copies of the standard modules beside the pipeline,
whose kvcache.flow is edited."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the llm roles run flowrt's reference engine: pip install 'flowc[models]'")
pytest.importorskip("tokenizers", reason="the llm roles tokenize with flowstd.tokenizer: pip install 'flowc[models]'")

from flowc.check import check_source  # noqa: E402
from flowc.codegen import build_bundle  # noqa: E402
from flowrt.deploy import open_deployment  # noqa: E402
from flowrt.errors import FlowrtError  # noqa: E402
from tests.conftest import REPO  # noqa: E402

LIB = REPO / "stdlib" / "flowstd" / "lib"
PIPELINES = {
    "llm": "import tokenizer\nimport llm\n\ngraph chat {\n    entry  messages\n    stream text_delta ordered\n    return generation\n}\n",
    "multimodal": "import multimodal\n\ngraph chat {\n    entry  request\n    stream token ordered\n    return image\n}\n",
    "voice": "import voice\n\ngraph chat {\n    entry  voice_request\n    stream speech ordered\n    return turn\n}\n",
}
FITTING = "layers 2, slices [k, v], heads 2, head_dim 16, page_tokens 16, dtype float32"


def bundle(tmp_path: Path, module: str, rename: tuple[str, str] = ("", ""), **settings) -> Path:
    """A pipeline importing `module` from a copy beside it (a role renamed, where asked), whose
    kvcache.flow has `settings`."""
    kvcache = (LIB / "kvcache.flow").read_text()
    for key, value in settings.items():
        kvcache, count = re.subn(rf"^(\s+{key}) \S+", rf"\1 {value}", kvcache, flags=re.MULTILINE)
        assert count == 1, key
    (tmp_path / "kvcache.flow").write_text(kvcache)
    text = (LIB / f"{module}.flow").read_text()
    if rename[0]:
        text = text.replace(f"role {rename[0]} {{", f"role {rename[1]} {{")
    (tmp_path / f"{module}.flow").write_text(text)
    source = tmp_path / "pipeline.flow"
    source.write_text(PIPELINES[module])
    result = check_source(source.read_text(), "pipeline.flow", source)
    assert result.diagnostics == [], [f"{d.code} {d.message}" for d in result.diagnostics]  # flowc does not know the model
    build_bundle(result.program, source, tmp_path / "bundle").write(tmp_path / "bundle")
    return tmp_path / "bundle"


async def opened(path: Path, deploy: str) -> None:
    deployment = await open_deployment(path, deploy)
    await deployment.close()


def refusal(path: Path, deploy: str = "inproc") -> str:
    with pytest.raises(FlowrtError) as raised:
        asyncio.run(opened(path, deploy))
    return str(raised.value)


@pytest.mark.parametrize(
    ("module", "role", "rename", "model"),
    [
        ("multimodal", "dit", ("", ""), "the multimodal LLM"),  # roles are set up in name order: dit first
        ("multimodal", "mm_llm", ("dit", "z_dit"), "the multimodal LLM"),  # the dit renamed to be set up after mm_llm
        ("voice", "thinker", ("", ""), "the voice thinker"),
    ],
)
def test_a_fixed_model_refuses_another_shape_in_setup_naming_both(tmp_path, module, role, rename, model):
    message = refusal(bundle(tmp_path, module, rename, heads=4, page_tokens=8))
    assert f"role `{role}`: setup() of replica 0 raised" in message, message
    assert f"global `kv` does not fit {model}" in message, message
    assert "the global's pages are layers 2, slices [k, v], heads 4, head_dim 16, page_tokens 8, dtype float32" in message
    assert f"the model's K/V need {FITTING}" in message
    assert "Set `heads 2`, `page_tokens 16` in `global kv`" in message


def test_the_refusal_is_in_setup_under_local_too(tmp_path):
    message = refusal(bundle(tmp_path, "voice", dtype="float16"), "local")
    assert "role `thinker`: setup() of replica 0 raised" in message, message
    assert "dtype float16; the model's K/V need" in message and "Set `dtype float32`" in message


def test_the_llm_role_refuses_a_global_it_cannot_hold_in_setup(tmp_path):
    message = refusal(bundle(tmp_path, "llm", dtype="int8"))
    assert "role `llm`: setup() of replica 0 raised" in message, message
    assert "it declares layers 2, slices [k, v], heads 2, head_dim 16, page_tokens 16, dtype int8" in message
    assert "set `dtype` to one of float32, bfloat16, float16, float8_e4m3 (it has int8)" in message


@pytest.mark.parametrize("module", ["llm", "multimodal", "voice"])
def test_the_standard_shape_fits_every_llm_module(tmp_path, module):
    asyncio.run(opened(bundle(tmp_path, module), "inproc"))  # the copies, unchanged, start
