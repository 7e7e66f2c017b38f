"""flowstd.roles.voice's request reading, without a deployment: the audio forms give the same clip,
a clip the encoder cannot take is refused naming the fix, a turn's layout frames the user's
segments with the chat template's markers and puts replies back by their ids, and the talker's
streams keep to the order of the reply's tokens."""

from __future__ import annotations

import asyncio
import base64
import io
import struct
import wave

import pytest

pytest.importorskip("torch", reason="the voice roles run on torch: pip install 'flowc[models]'")
pytest.importorskip("tokenizers", reason="the voice roles tokenize with flowstd.tokenizer: pip install 'flowc[models]'")
pytest.importorskip("soundfile", reason="the voice frontend reads WAV files with soundfile: pip install 'flowc[models]'")

from flowrt.errors import FlowrtError  # noqa: E402
from flowstd.models import AudioEncoderConfig  # noqa: E402
from flowstd.roles import voice  # noqa: E402
from flowstd.tokenizer import Tokenizer  # noqa: E402

SAMPLES = [int(8000 * ((i % 40) - 20) / 20) for i in range(400)]  # a sawtooth, 25 ms at 16 kHz
PCM = struct.pack(f"<{len(SAMPLES)}h", *SAMPLES)


def wav(rate: int = 16000, channels: int = 1) -> str:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(PCM * channels)
    return base64.b64encode(buffer.getvalue()).decode()


def parse(request) -> list[dict]:
    frontend = voice.Frontend()

    async def run():
        await frontend.setup(None)
        return [frame async for frame in frontend.parse(None, request)]

    return asyncio.run(run())


def test_other_rates_are_resampled_and_channels_mixed():
    """A WAV at 8 kHz, and raw samples said to be at 8 kHz, come out at 16 kHz (twice the samples);
    a stereo WAV whose two channels are the clip is the clip (flowrt.media)."""
    both = struct.pack(f"<{2 * len(SAMPLES)}h", *(value for value in SAMPLES for _ in range(2)))  # L, R, L, R, ...
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(2), out.setsampwidth(2), out.setframerate(16000), out.writeframes(both)
    stereo = base64.b64encode(buffer.getvalue()).decode()
    assert voice.audio_clip({"type": "audio", "format": "wav", "data": stereo}, 0).pcm16 == PCM
    slow = voice.audio_clip({"type": "audio", "format": "wav", "data": wav(rate=8000)}, 0)
    raw = voice.audio_clip({"type": "audio", "format": "pcm16", "data": base64.b64encode(PCM).decode(), "sample_rate": 8000}, 0)
    assert slow.samples == raw.samples == 2 * len(SAMPLES) and slow.pcm16 == raw.pcm16
    assert slow.pcm16[:4] == PCM[:2] + slow.pcm16[2:4] and slow.pcm16[4:6] == PCM[2:4]  # every other sample is an input's


def test_every_audio_form_gives_the_same_clip():
    assert AudioEncoderConfig().min_samples == voice.MIN_SAMPLES
    forms = [
        {"type": "audio", "format": "wav", "data": wav()},
        {"type": "audio", "format": "pcm16", "data": base64.b64encode(PCM).decode(), "sample_rate": 16000},
        {"type": "audio", "samples": [value / 32767 for value in SAMPLES]},
        {"type": "input_audio", "input_audio": {"data": wav(), "format": "wav"}},
    ]
    clips = [voice.audio_clip(form, 0) for form in forms]
    assert all(clip.pcm16 == PCM for clip in clips), [clip.samples for clip in clips]
    assert clips[0].waveform().shape == (400,)
    carried = clips[0].media()  # the clip carried in full: a PCM16 WAV of its samples
    assert (carried["format"], carried["sample_rate"], carried["samples"], carried["clip"]) == ("wav", 16000, 400, 0)
    with wave.open(io.BytesIO(base64.b64decode(carried["base64"]))) as file:
        assert file.readframes(400) == PCM


@pytest.mark.parametrize(
    ("segment", "words"),
    [
        ({"type": "audio", "format": "wav", "data": wav(rate=32000)}, "a clip of 200 samples at 16000 Hz; give 201"),
        (
            {"type": "audio", "format": "pcm16", "data": base64.b64encode(PCM[:200]).decode()},
            "a clip of 100 samples at 16000 Hz; give 201",
        ),
        ({"type": "audio", "format": "mp3", "data": wav()}, "audio `format` is wav, flac, ogg or pcm16, not 'mp3'"),
        ({"type": "audio", "format": "wav", "data": "not base64!"}, "the audio is not valid base64"),
        (
            {"type": "audio", "format": "wav", "data": "https://example.com/a.wav"},
            "is a remote URL, and the server fetches nothing",
        ),
        (
            {"type": "audio", "format": "pcm16", "data": base64.b64encode(PCM).decode(), "sample_rate": 0},
            "`sample_rate` is a whole number",
        ),
        ({"type": "audio"}, "an audio segment needs `data`"),
        (  # raw audio is held to the duration limit before it is resampled
            {"type": "audio", "format": "pcm16", "data": base64.b64encode(PCM).decode(), "sample_rate": 1},
            "a clip of 400 samples at 1 Hz; give 1 to 30 (30 s: FLOWRT_MAX_AUDIO_SECONDS)",
        ),
    ],
)
def test_a_clip_the_encoder_cannot_take_is_refused_naming_the_fix(segment, words):
    with pytest.raises(voice.VoiceInputError, match="segment 3: ") as raised:
        voice.audio_clip(segment, 3)
    assert words in str(raised.value)


def test_a_turns_layout_frames_the_users_segments_and_puts_replies_back_by_id():
    tokenizer = Tokenizer.load()
    user, eos, assistant = (tokenizer.special_ids[name] for name in ("<|user|>", "<|eos|>", "<|assistant|>"))
    clip = {"type": "audio", "format": "wav", "data": wav()}
    frames = parse({"segments": [clip, {"type": "text", "text": "hi"}, {"type": "reply", "tokens": [300, 301]}, clip], "step": 0})
    assert [next(iter(frame)) for frame in frames] == ["voice_audio", "voice_audio", "voice_prompt"]  # clips first
    assert [frame["voice_audio"].index for frame in frames[:2]] == [0, 1]
    prompt = frames[-1]["voice_prompt"]
    assert prompt["parts"] == [
        {"text": [user]},
        {"audio": 0},
        {"text": [*tokenizer.encode("hi"), eos, assistant, 300, 301, user]},
        {"audio": 1},
        {"text": [eos, assistant]},
    ]
    assert (prompt["clips"], prompt["step"], prompt["max_tokens"]) == (2, 0, voice.DEFAULT_MAX_TOKENS)


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        ({"segments": []}, "or an OpenAI chat body"),
        ({"segments": [{"type": "reply", "tokens": [5]}]}, "segment 0: a reply answers a user turn"),
        ({"segments": [{"type": "text", "text": "hi"}, {"type": "reply", "tokens": [5]}]}, "the request ends with a reply"),
        ({"segments": [{"type": "text", "text": "hi"}, {"type": "reply", "tokens": [9999]}]}, "outside the vocabulary of 3072"),
        ({"segments": [{"type": "image"}]}, "segment 0: give type `audio`, `text`"),
        ({"segments": [{"type": "text", "text": "hi"}], "max_tokens": 0}, "max_tokens is a whole number from 1 to 512"),
        ({"segments": [{"type": "text", "text": "hi"}], "step": "3"}, "step is the position the client holds"),
    ],
)
def test_a_request_the_frontend_cannot_read_is_refused_naming_the_fix(request_, words):
    with pytest.raises(FlowrtError) as raised:
        parse(request_)
    assert words in str(raised.value)


class Call:
    def __init__(self, call_id: int):
        self.session, self.call_id = "s", call_id


def test_the_talker_refuses_tokens_out_of_order_once_and_speaks_at_the_last():
    talker = voice.Talker()

    async def speak(call: int, index: int, last: bool = False) -> list[dict]:
        return [frame async for frame in talker.speak(Call(call), {"token": 300 + index, "index": index, "last": last})]

    async def run():
        await talker.setup(None)
        assert await speak(1, 0) == []  # 4 frames: no block's window has arrived yet
        assert len(talker.streams) == 1
        with pytest.raises(voice.VoiceStateError, match="got token 2 of the reply, expecting 1") as raised:
            await speak(1, 2)
        assert not isinstance(raised.value, voice.BadInput)  # lost state is not the caller's doing: a 500, not a 400
        assert talker.streams == {}  # the failed call's stream is dropped
        # the rest of that reply is not spoken, and fails no more: one error, not one per token
        assert [await speak(1, index) for index in (3, 4)] == [[], []] and talker.streams == {}
        assert await speak(2, 0) == []
        return await speak(2, 1, last=True)

    (frame,) = asyncio.run(run())
    assert frame["speech"].samples == 2 * voice.FRAMES_PER_TOKEN * 160 and frame["speech"].offset == 0
    assert talker.streams == {}  # the reply's stream ended with its last token
