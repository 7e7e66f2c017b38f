"""The OpenAI media surface on flowstd's real tiny models (docs/openai.md), under `inproc` and
`local`, driven by the official openai client: `/v1/images/generations` (multimodal's text to
image), `/v1/audio/speech` (lib/speech.flow), `/v1/embeddings` (lib/embedding.flow) and
`/v1/chat/completions` answering one message of text, a PNG and a JPEG `image_url` and a WAV
`input_audio` (lib/omni.flow) with text and audio (`modalities`), gathered and streamed, and
multimodal's chat of PNG and JPEG `image_url`s with text. Every answer's media decode
(Pillow, soundfile) to exactly what the graph's roles gave in an embedded reference run."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import pytest

pytest.importorskip("torch", reason="the roles' models run on torch: pip install 'flowc[models]'")
pytest.importorskip("tokenizers", reason="the roles tokenize with flowstd.tokenizer: pip install 'flowc[models]'")
Image = pytest.importorskip("PIL.Image", reason="images are decoded with Pillow: pip install 'flowc[media]'")
soundfile = pytest.importorskip("soundfile", reason="audio is decoded with soundfile: pip install 'flowc[media]'")

import numpy  # noqa: E402
import openai  # noqa: E402

from flowc.check import check_source  # noqa: E402
from flowc.codegen import build_bundle  # noqa: E402
from flowrt import media  # noqa: E402
from flowrt.deploy import open_deployment  # noqa: E402
from tests.examples_models.test_media_roles import (  # noqa: E402
    audio_file,
    audio_part,
    data_url,
    image_file,
    image_part,
    lying_png,
    text_part,
)
from tests.gateway.guarded import command, request  # noqa: E402
from tests.runtime.test_serve import serving  # noqa: E402

FLOW = """flow media_endpoints

import multimodal
import omni
import speech
import embedding

graph look {
    entry  request
    stream token ordered
    return image
    serves chat
}

graph draw {
    entry  request
    return image
    serves images
    allow W210
}

graph talk {
    entry  omni_request
    stream answer ordered
    stream speech ordered
    return omni_turn
    serves chat
}

graph say {
    entry  speech_text
    stream speech ordered
    serves speech
}

graph embed {
    entry  embed_text
    return embedding, embed_usage
    serves embeddings
}
"""
PROMPT = "a lighthouse at dusk"
SPOKEN = "hello from the talker"
TEXTS = ["first text", "a second, longer text to embed"]
QUESTION = "what do you hear and see?"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    directory = tmp_path_factory.mktemp("media_endpoints")
    source = directory / "pipeline.flow"
    source.write_text(FLOW)
    result = check_source(FLOW, "pipeline.flow", source)
    assert result.ok, [f"{d.code} {d.message}" for d in result.diagnostics]
    build_bundle(result.program, source, directory / "bundle").write(directory / "bundle")
    return directory / "bundle"


TONE = (numpy.sin(numpy.arange(6400) / 5.0) * 7000).astype("<i2")
PIXELS = numpy.random.default_rng(5).integers(0, 256, (20, 28, 3), dtype=numpy.uint8)
CHAT = [  # text, a PNG, a JPEG and a WAV, in one message (the omni module)
    {
        "role": "user",
        "content": [
            text_part(QUESTION),
            image_part(data_url(image_file("PNG", PIXELS))),
            image_part(data_url(image_file("JPEG", PIXELS[::-1].copy(), quality=90), "image/jpeg")),
            audio_part(audio_file(samples=TONE)),
        ],
    }
]
LOOK = [
    {
        "role": "user",
        "content": [
            text_part("compare"),
            image_part(data_url(image_file("PNG", PIXELS))),
            image_part(data_url(image_file("JPEG", PIXELS, quality=95), "image/jpeg")),
        ],
    }
]


@pytest.fixture(scope="module")
def embedded(bundle):
    """The embedding graph's vectors from an embedded deployment (tensors: /graphs summarises them)."""

    async def run():
        deployment = await open_deployment(bundle, "inproc")
        try:
            vectors = []
            for text in TEXTS:
                async for event in deployment.runtime.call("embed", {"embed_text": text}, timeout=120):
                    if event.get("field") == "embedding":
                        vectors.append(event["value"].numpy())
            return vectors
        finally:
            await deployment.close()

    return asyncio.run(run())


def outputs(server, graph: str, entry: str, value) -> dict[str, list]:
    """One call's outputs over POST /graphs of the same server: media carried in full."""
    status, _, body = request(server, "POST", f"/graphs/{graph}", {entry: value})
    events = [json.loads(line) for line in body.splitlines()]
    assert status == 200 and events[-1]["status"] == "ok", events[-1]
    got: dict[str, list] = {}
    for event in events[:-1]:
        got.setdefault(event["field"], []).append(event["value"])
    return got


def pcm_of(carried: list[dict]) -> bytes:
    return b"".join(media.carried_pcm16(piece)[0] for piece in carried)


def decoded_wav(data: bytes) -> tuple[bytes, int]:
    samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")
    return samples.astype("<i2").tobytes(), rate


@pytest.mark.parametrize("deploy", ["inproc", "local"])
def test_every_endpoint_answers_the_official_client_with_the_roles_media(bundle, embedded, deploy):
    with serving(bundle, command(bundle, "--deploy", deploy, "--grace", "0")) as server:
        reference = {  # what the roles give in this deployment, over /graphs
            "draw": outputs(server, "draw", "request", {"model": "draw", "prompt": PROMPT}),
            "say": outputs(server, "say", "speech_text", SPOKEN),
            "embed": [outputs(server, "embed", "embed_text", text) for text in TEXTS],
            "talk": outputs(server, "talk", "omni_request", {"model": "talk", "messages": CHAT}),
            "look": outputs(server, "look", "request", {"model": "look", "messages": LOOK}),
        }
        client = openai.OpenAI(base_url=f"http://{server.host}:{server.port}/v1", api_key="none", timeout=120, max_retries=0)
        listed = {model.id: model.model_dump()["endpoints"] for model in client.models.list()}
        assert listed == {"draw": ["images"], "embed": ["embeddings"], "look": ["chat"], "say": ["speech"], "talk": ["chat"]}

        # images: a PNG of the VAE's decoded pixels
        image = client.images.generate(model="draw", prompt=PROMPT)
        png = base64.b64decode(image.data[0].b64_json)
        expected = Image.open(io.BytesIO(base64.b64decode(reference["draw"]["image"][0]["base64"])))
        decoded = Image.open(io.BytesIO(png))
        assert decoded.format == "PNG" and decoded.size == expected.size
        assert decoded.convert("RGB").tobytes() == expected.convert("RGB").tobytes()

        # speech: the talker's samples, as a WAV and as raw PCM16
        wav = client.audio.speech.create(model="say", voice="alloy", input=SPOKEN, response_format="wav").content
        assert decoded_wav(wav) == (pcm_of(reference["say"]["speech"]), 16000)
        pcm = client.audio.speech.create(model="say", voice="alloy", input=SPOKEN, response_format="pcm").content
        assert pcm == pcm_of(reference["say"]["speech"])

        # embeddings: the model's vectors, in order (the client asks for base64 float32; floats alike)
        answer = client.embeddings.create(model="embed", input=TEXTS)
        floats = client.embeddings.create(model="embed", input=TEXTS, encoding_format="float")
        assert [item.index for item in answer.data] == [0, 1]
        for item, as_floats, vector in zip(answer.data, floats.data, embedded, strict=True):
            assert (
                numpy.asarray(item.embedding, dtype=numpy.float32).tobytes()
                == numpy.asarray(as_floats.embedding, dtype=numpy.float32).tobytes()
            )
            # (another process may sum in another order: equal to float32 rounding)
            assert numpy.allclose(item.embedding, vector, atol=1e-6) and len(item.embedding) == vector.shape[0]
        assert answer.usage.prompt_tokens == sum(o["embed_usage"][0]["prompt_tokens"] for o in reference["embed"]) > 0

        # chat, text, a PNG, a JPEG and a WAV in; text and audio out, gathered (WAV) and streamed (PCM16 chunks)
        speech, reply = pcm_of(reference["talk"]["speech"]), "".join(reference["talk"]["answer"])
        answer = client.chat.completions.create(
            model="talk", messages=CHAT, modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"}
        )
        audio = answer.choices[0].message.audio
        assert decoded_wav(base64.b64decode(audio.data)) == (speech, 16000)
        assert audio.transcript == reply and answer.choices[0].message.content is None
        assert audio.model_dump()["sample_rate"] == 16000  # the talker's rate, not OpenAI's 24 kHz
        assert answer.usage.prompt_tokens == reference["talk"]["omni_turn"][0]["prompt_tokens"] > 0
        chunks = list(
            client.chat.completions.create(
                model="talk",
                messages=CHAT,
                modalities=["text", "audio"],
                audio={"voice": "alloy", "format": "pcm16"},
                stream=True,
            )
        )
        deltas = [chunk.choices[0].delta.audio for chunk in chunks if chunk.choices and chunk.choices[0].delta.audio]
        pieces = [base64.b64decode(d.data) for d in deltas if getattr(d, "data", None)]
        assert {d.model_dump()["sample_rate"] for d in deltas if getattr(d, "data", None)} == {16000}
        assert len(pieces) == len(reference["talk"]["speech"]) > 1 and b"".join(pieces) == speech
        assert "".join(d.transcript for d in deltas if getattr(d, "transcript", None)) == reply
        text_only = client.chat.completions.create(model="talk", messages=CHAT)
        assert text_only.choices[0].message.content == reply and text_only.choices[0].message.audio is None

        # chat, PNG and JPEG image_urls with text: the LLM's tokens
        looked = client.chat.completions.create(model="look", messages=LOOK)
        assert looked.choices[0].message.content == "".join(reference["look"]["token"])
        assert request(server, "GET", "/health")[0] == 200  # still serving


@pytest.fixture(scope="module")
def client(bundle):
    with serving(bundle, command(bundle, "--grace", "0")) as server:
        yield openai.OpenAI(base_url=f"http://{server.host}:{server.port}/v1", api_key="none", timeout=60, max_retries=0)


@pytest.mark.parametrize(
    ("call", "param", "words"),
    [
        (lambda c: c.images.generate(model="say", prompt="x"), "model", "does not serve images (it serves speech)"),
        (lambda c: c.images.generate(model="draw", prompt="x", n=2), "n", "`n` must be 1"),
        (lambda c: c.images.generate(model="draw", prompt="x", response_format="url"), "response_format", "b64_json"),
        (
            lambda c: c.audio.speech.create(model="say", voice="a", input="x", response_format="mp3"),
            "response_format",
            "wav, pcm",
        ),
        (lambda c: c.audio.speech.create(model="say", voice="a", input=""), "input", "non-empty text"),
        (lambda c: c.embeddings.create(model="embed", input=[]), "input", "not an empty list"),
        (lambda c: c.embeddings.create(model="embed", input=[[1, 2]]), "input", "not token ids"),
        (lambda c: c.embeddings.create(model="embed", input="x", dimensions=8), "dimensions", "not supported"),
        (lambda c: c.embeddings.create(model="talk", input="x"), "model", "does not serve embeddings (it serves chat)"),
        (
            lambda c: c.chat.completions.create(
                model="look",
                messages=[{"role": "user", "content": "x"}],
                modalities=["text", "audio"],
                audio={"voice": "a", "format": "wav"},
            ),
            "modalities",
            "no `Audio` output",
        ),
        (
            lambda c: c.chat.completions.create(
                model="talk", messages=CHAT, modalities=["text", "audio"], audio={"voice": "a", "format": "wav"}, stream=True
            ),
            "audio.format",
            '"pcm16"',
        ),
        (
            lambda c: c.chat.completions.create(model="talk", messages=CHAT, modalities=["text", "audio"]),
            "audio",
            "send `audio` as an object",
        ),
        (lambda c: c.chat.completions.create(model="draw", messages=CHAT), "model", "serves images, not chat"),
    ],
)
def test_requests_an_endpoint_cannot_serve_are_400_naming_the_parameter(client, call, param, words):
    with pytest.raises(openai.BadRequestError) as raised:
        call(client)
    assert raised.value.status_code == 400 and raised.value.body["param"] == param, raised.value.body
    assert words in raised.value.message


def test_an_unknown_model_is_404_and_corrupt_media_400_and_the_server_keeps_serving(client):
    with pytest.raises(openai.NotFoundError, match="models: draw"):
        client.images.generate(model="paint", prompt="x")
    lying = bytearray(audio_file(samples=TONE))
    lying[40:44] = (10**9).to_bytes(4, "little")  # the data chunk claims a gigabyte
    corrupt = [
        (image_part(data_url(image_file("PNG", PIXELS)[:60])), "messages[0].content[1]"),
        (image_part(data_url(lying_png(20000, 20000))), "400,000,000 pixels; the limit is 16,777,216"),
        (image_part(data_url(image_file("GIF", PIXELS), "image/gif")), "PNG, JPEG or WebP"),
        (audio_part(bytes(lying)), "the WAV's header says its samples are 1,000,000,000 bytes"),
    ]
    for part, words in corrupt:
        with pytest.raises(openai.BadRequestError) as raised:  # (max_retries=0: a 400 is not retried anyway)
            client.chat.completions.create(model="talk", messages=[{"role": "user", "content": [text_part("hi"), part]}])
        assert raised.value.code == "bad_input" and words in raised.value.message, raised.value.message
    assert client.images.generate(model="draw", prompt=PROMPT).data[0].b64_json  # still serving
