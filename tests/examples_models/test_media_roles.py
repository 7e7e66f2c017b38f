"""flowstd's multimodal and voice roles with real media, on the embedded runtime (`--deploy
inproc`) of examples/image_chat_models and examples/voice_chat: images as PNG, JPEG and WebP
(data URLs, base64), audio as WAV and FLAC, and OpenAI chat bodies give what the native segments
give; corrupt media fail the call naming the part and the limit, leave nothing behind
(`statistics()` all zero) and the next call is served; the events' media, carried in full
(`event_json(event, media=True)`), decode to the VAE's pixels and the vocoder's samples exactly.
Media files are made here with Pillow and soundfile."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import struct
import zlib

import pytest

pytest.importorskip("torch", reason="the roles' models run on torch: pip install 'flowc[models]'")
pytest.importorskip("tokenizers", reason="the roles tokenize with flowstd.tokenizer: pip install 'flowc[models]'")
Image = pytest.importorskip("PIL.Image", reason="images are decoded with Pillow: pip install 'flowc[media]'")
soundfile = pytest.importorskip("soundfile", reason="audio is decoded with soundfile: pip install 'flowc[media]'")

import numpy  # noqa: E402

from flowc.check import check_source  # noqa: E402
from flowc.codegen import build_bundle  # noqa: E402
from flowrt import media  # noqa: E402
from flowrt.deploy import open_deployment  # noqa: E402
from flowrt.values import event_json, summarize  # noqa: E402
from flowstd.roles import multimodal  # noqa: E402
from flowstd.tokenizer import Tokenizer  # noqa: E402
from tests.conftest import REPO  # noqa: E402

PIXELS = numpy.random.default_rng(3).integers(0, 256, (24, 40, 3), dtype=numpy.uint8)
TONE = (numpy.sin(numpy.arange(4800) / 6.0) * 9000).astype("<i2")  # 0.3 s at 16 kHz
QUESTION = "what is in this picture?"


def image_file(format="PNG", pixels=PIXELS, **options) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=format, **options)
    return out.getvalue()


def audio_file(format="WAV", samples=TONE, rate=16000) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format=format)
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, mime="image/png") -> str:
    return f"data:{mime};base64,{b64(data)}"


def bundle(name: str, directory):
    source = REPO / "examples" / name / "pipeline.flow"
    result = check_source(source.read_text(), "pipeline.flow", source)
    assert result.ok, [f"{d.code} {d.message}" for d in result.diagnostics]
    build_bundle(result.program, source, directory).write(directory)
    return directory


@pytest.fixture(scope="module")
def image_chat(tmp_path_factory):
    return bundle("image_chat_models", tmp_path_factory.mktemp("image_chat_models") / "bundle")


@pytest.fixture(scope="module")
def voice_chat(tmp_path_factory):
    return bundle("voice_chat", tmp_path_factory.mktemp("voice_chat") / "bundle")


def served(path, graph: str, entry: str, requests: list) -> tuple[list[list[dict]], dict]:
    """Each request's events (the `done` event last) from one deployment, and its statistics after."""

    async def run():
        deployment = await open_deployment(path, "inproc")
        try:
            answers = []
            for request in requests:
                answers.append([event async for event in deployment.runtime.call(graph, {entry: request}, timeout=60)])
            return answers, deployment.runtime.statistics()
        finally:
            await deployment.close()

    return asyncio.run(run())


def fields(events: list[dict], media: bool = False) -> dict[str, list]:
    assert events[-1]["status"] == "ok", events[-1]
    grouped: dict[str, list] = {}
    for event in events[:-1]:
        grouped.setdefault(event["field"], []).append(json.loads(event_json(event, media=media))["value"])
    return grouped


def failure(events: list[dict]) -> str:
    done = events[-1]
    assert done["status"] == "error" and [event for event in events if "field" in event] == [], events
    return done["errors"][0]["message"]


def assert_nothing_left(statistics: dict) -> None:
    assert all(value == 0 for value in statistics.values()), statistics


def chat_body(*parts, **more) -> dict:
    return {"messages": [{"role": "user", "content": list(parts)}], **more}


def text_part(text: str) -> dict:
    return {"type": "text", "text": text}


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}


def audio_part(data: bytes, format="wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": b64(data), "format": format}}


# ── multimodal ──


def parse(request) -> list[dict]:
    async def run():
        return [frame async for frame in multimodal.Frontend().parse(None, request)]

    return asyncio.run(run())


def test_every_image_form_gives_the_same_segments():
    raw = {"type": "image", "width": 40, "height": 24, "base64": b64(PIXELS.tobytes())}
    native = parse({"segments": [{"type": "text", "text": QUESTION}, raw]})
    png, webp = image_file("PNG"), image_file("WEBP", lossless=True)
    for image in (
        {"type": "image", "pixels": PIXELS.tolist()},
        {"type": "image", "url": data_url(png)},
        {"type": "image", "base64": b64(png)},
        {"type": "image", "url": data_url(webp, "image/webp")},
        image_part(data_url(png)),
    ):
        assert parse({"segments": [{"type": "text", "text": QUESTION}, image]}) == native
    # an OpenAI body: its text and image parts, in order, are the segments
    assert parse(chat_body(text_part(QUESTION), image_part(data_url(png)))) == native
    assert (
        parse({"messages": [{"role": "user", "content": QUESTION}, {"role": "user", "content": [image_part(data_url(png))]}]})
        == native
    )
    carried = native[1]["image_seg"].media()  # the decoded image carried in full: a PNG of its pixels
    assert (carried["format"], carried["width"], carried["height"]) == ("png", 40, 24)
    assert numpy.array_equal(numpy.asarray(Image.open(io.BytesIO(base64.b64decode(carried["base64"])))), PIXELS)
    image_first = parse(
        [{"role": "user", "content": [image_part(data_url(webp, "image/webp")), text_part(QUESTION)]}]
    )  # a list of messages
    assert image_first == [native[1], {"text_seg": {"text": QUESTION, "index": 1}}]


def test_an_openai_body_gives_the_native_events(image_chat):
    png, jpeg = image_file("PNG"), image_file("JPEG", quality=85)
    decoded_jpeg = numpy.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))
    requests = [
        {"segments": [{"type": "image", "pixels": PIXELS.tolist()}, {"type": "text", "text": QUESTION}]},
        chat_body(image_part(data_url(png)), text_part(QUESTION)),  # image first: any order
        {"segments": [{"type": "image", "pixels": decoded_jpeg.tolist()}, {"type": "text", "text": QUESTION}]},
        chat_body(image_part(data_url(jpeg, "image/jpeg")), text_part(QUESTION)),
    ]
    answers, statistics = served(image_chat, "chat", "request", requests)
    native, openai, native_jpeg, openai_jpeg = (fields(events, media=True) for events in answers)
    for left, right in ((native, openai), (native_jpeg, openai_jpeg)):
        assert left["token"] == right["token"] and left["usage"][-1]["completion_tokens"] == 8
        assert left["image"] == right["image"]  # the returned PNG, byte for byte
        assert [usage["prompt_tokens"] for usage in left["usage"]] == [usage["prompt_tokens"] for usage in right["usage"]]
    assert_nothing_left(statistics)


def lying_png(width: int, height: int) -> bytes:
    data = bytearray(image_file())
    struct.pack_into(">II", data, 16, width, height)
    struct.pack_into(">I", data, 29, zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def test_corrupt_images_fail_the_call_naming_the_part_and_nothing_leaks(image_chat):
    png = image_file()
    bad = [
        (data_url(png[: len(png) // 2]), "messages[0].content[1]: the PNG is corrupt or truncated"),
        (
            data_url(lying_png(20000, 20000)),
            "messages[0].content[1]: a 20000x20000 PNG is 400,000,000 pixels; the limit is 16,777,216 (FLOWRT_MAX_IMAGE_PIXELS)",
        ),
        (data_url(image_file("GIF"), "image/gif"), "messages[0].content[1]: a GIF file; give PNG, JPEG or WebP"),
        ("https://example.com/cat.png", "messages[0].content[1]: https://example.com/cat.png is a remote URL"),
    ]
    requests = [chat_body(text_part(QUESTION), image_part(url)) for url, _ in bad]
    requests.append(chat_body(text_part(QUESTION), audio_part(audio_file())))
    requests.append({"segments": [{"type": "text", "text": QUESTION}, {"type": "image", "base64": b64(png[:60])}]})
    requests.append(chat_body(text_part(QUESTION), image_part(data_url(png))))  # and the next call is served
    answers, statistics = served(image_chat, "chat", "request", requests)
    for (_, words), events in zip(bad, answers, strict=False):
        assert f"MultimodalInputError: {words}" in failure(events)
    assert "messages[0].content[1]: an audio part; the multimodal module reads text and images" in failure(answers[4])
    assert "MultimodalInputError: segment 1: the PNG is corrupt or truncated" in failure(answers[5])
    assert fields(answers[6])["usage"][-1]["completion_tokens"] == 8
    assert_nothing_left(statistics)


def test_the_generated_image_is_carried_as_a_png_of_the_vaes_pixels(image_chat):
    (events,), statistics = served(image_chat, "draw", "request", [chat_body(text_part("a red square"))])
    (returned,) = [event for event in events if event.get("field") == "image"]
    assert summarize(returned["value"]) == returned["value"].summary()  # summaries stay the default
    carried = json.loads(event_json(returned, media=True))["value"]
    assert (carried["format"], carried["width"], carried["height"]) == ("png", 32, 32)
    decoded = numpy.asarray(Image.open(io.BytesIO(base64.b64decode(carried["base64"]))))
    assert numpy.array_equal(decoded, returned["value"].pixels.numpy())  # the VAE's output, exactly
    assert_nothing_left(statistics)


# ── voice ──


def turn_of(events: list[dict]) -> dict:
    grouped = fields(events)
    speech = b"".join(event["value"].pcm16 for event in events if event.get("field") == "speech")
    (turn,) = grouped["turn"]
    return {"reply": "".join(grouped["reply"]), "speech": speech, "tokens": turn["reply_tokens"], "prompt": turn["prompt_tokens"]}


def test_an_openai_body_gives_the_native_turn(voice_chat):
    wav, flac = audio_file("WAV"), audio_file("FLAC")
    answer = "hello there"
    answer_ids = Tokenizer.load().encode(answer)
    requests = [
        {"segments": [{"type": "audio", "format": "wav", "data": b64(wav)}, {"type": "text", "text": QUESTION}], "max_tokens": 8},
        chat_body(audio_part(wav), text_part(QUESTION), max_tokens=8),
        chat_body(audio_part(flac, "flac"), text_part(QUESTION), max_completion_tokens=8),
        {
            "segments": [
                {"type": "audio", "format": "wav", "data": data_url(wav, "audio/wav")},
                {"type": "text", "text": QUESTION},
            ],
            "max_tokens": 8,
        },
        # a conversation: the assistant's text is the reply, put back by its ids; the whole of it, at step 0
        {
            "segments": [
                {"type": "audio", "format": "wav", "data": b64(wav)},
                {"type": "reply", "tokens": answer_ids},
                {"type": "text", "text": QUESTION},
            ],
            "max_tokens": 8,
            "step": 0,
        },
        {
            "messages": [
                {"role": "user", "content": [audio_part(wav)]},
                {"role": "assistant", "content": answer},
                {"role": "user", "content": QUESTION},
            ],
            "max_tokens": 8,
        },
    ]
    answers, statistics = served(voice_chat, "chat", "voice_request", requests)
    turns = [turn_of(events) for events in answers]
    assert turns[0] == turns[1] == turns[2] == turns[3] and len(turns[0]["tokens"]) == 8 and turns[0]["speech"]
    assert turns[4] == turns[5] and turns[4]["prompt"] > turns[0]["prompt"]
    assert_nothing_left(statistics)


def test_speech_is_carried_as_wavs_of_the_vocoders_samples(voice_chat):
    request = {"segments": [{"type": "text", "text": QUESTION}], "max_tokens": 12}
    (events,), _ = served(voice_chat, "chat", "voice_request", [request])
    chunks = [event for event in events if event.get("field") == "speech"]
    assert len(chunks) >= 2
    for event in chunks:
        carried = json.loads(event_json(event, media=True))["value"]
        chunk = event["value"]
        assert carried["format"] == "wav" and (carried["sample_rate"], carried["samples"]) == (16000, chunk.samples)
        assert (carried["chunk"], carried["offset"]) == (chunk.index, chunk.offset)
        samples, rate = soundfile.read(io.BytesIO(base64.b64decode(carried["base64"])), dtype="int16")
        assert rate == 16000 and samples.astype("<i2").tobytes() == chunk.pcm16  # the vocoder's PCM16, exactly
    whole = media.joined_wav([json.loads(event_json(event, media=True))["value"] for event in chunks])  # one answer's audio
    samples, _ = soundfile.read(io.BytesIO(base64.b64decode(whole["base64"])), dtype="int16")
    assert samples.astype("<i2").tobytes() == b"".join(event["value"].pcm16 for event in chunks) and whole["samples"] == len(
        samples
    )


def lying_wav() -> bytes:
    data = bytearray(audio_file())
    struct.pack_into("<I", data, data.index(b"data") + 4, 10**6)
    return bytes(data)


def test_corrupt_audio_fails_the_call_naming_the_part_and_nothing_leaks(voice_chat, monkeypatch):
    wav = audio_file()
    bad = [
        (chat_body(audio_part(lying_wav())), "messages[0].content[0]: the WAV's header says its samples are 1,000,000 bytes"),
        (
            chat_body(audio_part(wav), audio_part(wav[:500])),
            "messages[0].content[1]: the WAV's header says its samples are 9,600 bytes",
        ),
        (chat_body(audio_part(image_file())), "messages[0].content[0]: a PNG file; give WAV, FLAC or OGG"),
        (
            chat_body(image_part(data_url(image_file())), text_part(QUESTION)),
            "messages[0].content[0]: an image part; the voice module",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": None, "audio": {"id": "a1"}},
                    {"role": "user", "content": "and?"},
                ]
            },
            "messages[1]: an assistant message without text",
        ),
    ]
    answers, statistics = served(voice_chat, "chat", "voice_request", [request for request, _ in bad])
    for (_, words), events in zip(bad, answers, strict=True):
        assert f"VoiceInputError: {words}" in failure(events)
    assert_nothing_left(statistics)
    monkeypatch.setenv("FLOWRT_MAX_AUDIO_SECONDS", "0.2")  # the limit is read at each call
    (events, served_next), statistics = served(
        voice_chat, "chat", "voice_request", [chat_body(audio_part(wav)), chat_body(text_part("hi"), max_tokens=4)]
    )
    assert (
        "messages[0].content[0]: a WAV of 0.3 s (4,800 samples at 16000 Hz); the limit is 0.2 s (FLOWRT_MAX_AUDIO_SECONDS)"
        in failure(events)
    )
    assert len(turn_of(served_next)["tokens"]) == 4
    assert_nothing_left(statistics)
