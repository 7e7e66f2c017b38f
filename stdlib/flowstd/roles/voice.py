"""The roles of lib/voice.flow: omni voice chat on real tiny models (docs/stdlib.md, "The `voice` module").

    Frontend.parse           voice_request -> stream voice_audio (one per clip, as it is read),
                             then voice_prompt (the turn's layout: text ids and clip numbers)
    AudioEncoderRole.encode  voice_audio -> audio_emb: the clip's AudioEncoder rows, cached by
                             the clip's content hash, and what the cache did (hit, join, miss)
    Thinker.generate         join {voice_prompt: 1, audio_emb: all} -> stream reply (text pieces),
                             spoken (each sampled id, for the talker), then turn (the counts)
    Talker.speak             spoken -> stream speech (PCM16 chunks of a streaming vocoder)

The thinker is flowrt's reference engine (vocabulary of flowstd's tokenizer, hidden 64, lib/
kvcache.flow's K/V shape), driven by a `PlannedGenerator` from `PrefixMatcher` plans over the
pool of `global kv`: each turn appends to the session's history (incremental matching, with the
request's `step` when it gives one), the pages the pool holds are reused (turn 1's prompt and
reply, in turn 2), only the rest is prefilled, and the reply is decoded greedily; its ids are
recorded in the history, so turn 2 computes only its own positions (and turn 1's last, partial
page). A user turn is `<|user|>`, its segments (text ids, or an audio clip's encoder rows), then
`<|eos|><|assistant|>`; a `reply` segment puts an answer the model gave back after it, by ids.

The talker turns each token into speech as it is sampled: the thinker's embedding of the token,
held for FRAMES_PER_TOKEN frames (a fixed duration model), into a `VocoderStream` whose blocks
of VOCODER_BLOCK_FRAMES frames come out once their window has arrived. So speech starts after a
few tokens, long before the text ends; the chunks concatenate to the vocoder's `synthesize` of
the whole reply, bit for bit. A stream lives in the talker's replica, keyed by the session and
call (`lb session` keeps them there, in order); at most MAX_STREAMS are held, the oldest dropped.

Models come from seeds (docs/models.md): every process builds the same ones, lazily, only those
its role needs (`VoiceRuntime.shared()`). Outputs are untrained: the text is gibberish and the
speech noise, but every step of serving is real and deterministic.
"""

from __future__ import annotations

import base64
import binascii
import io
import wave
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from flowrt.compute.encoder_cache import EncoderCache
from flowrt.compute.engine import ContinuousBatcher, ReferenceConfig, ReferenceEngine
from flowrt.compute.engine.planned import PlannedGenerator
from flowrt.compute.prefix import Media, PrefixMatcher, Text
from flowrt.errors import FlowrtError
from flowstd.roles.llm import check_kv_fits, engines_for, stream_generation, token_ids

GLOBAL = "kv"  # the KVCache global lib/voice.flow imports (lib/kvcache.flow)
PAGE_TOKENS = 16
SAMPLE_RATE = 16000  # audio in and out; there is no resampling
MAX_CLIP_SECONDS = 30
MIN_SAMPLES = 201  # the audio encoder's shortest clip (AudioEncoderConfig.min_samples: n_fft // 2 + 1)
DEFAULT_MAX_TOKENS = 24  # the reply's budget when the request sets no max_tokens
MAX_TOKENS = 512
FRAMES_PER_TOKEN = 4  # the talker's duration model: 4 vocoder frames (40 ms) of speech per token
VOCODER_BLOCK_FRAMES = 8  # a block of speech (80 ms) is final once 8 + 7 (context) frames arrived
MAX_STREAMS = 256  # talker streams a replica holds (a call cancelled mid-reply leaves one behind)
NAMESPACE = "flowstd.voice"  # roots the thinker's page chains: no other model shares its pages


class VoiceInputError(FlowrtError, ValueError):
    """A request the voice roles cannot read: the message names the fix."""


def llm_config() -> ReferenceConfig:
    """The thinker: the reference engine over flowstd's tokenizer vocabulary (3072 ids)."""
    return ReferenceConfig(vocab_size=3072, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, seed=21)


class VoiceRuntime:
    """This process's models, each built on first use (see the module docstring)."""

    _shared: VoiceRuntime | None = None

    @classmethod
    def shared(cls) -> VoiceRuntime:
        if cls._shared is None:
            cls._shared = cls()
        return cls._shared

    def build(self, *names: str) -> VoiceRuntime:
        """Build the named models now (a role's setup), not at its first call."""
        for name in names:
            getattr(self, name)
        return self

    def __init__(self) -> None:
        # a deployment's pool lives as long as the deployment; a process may open several in turn (tests)
        self._engines: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @cached_property
    def tokenizer(self) -> Any:
        from flowstd.tokenizer import Tokenizer

        return Tokenizer.load()

    @cached_property
    def embedder(self) -> ReferenceEngine:
        """The thinker's weights, for embedding only (the talker's input): never bound to a pool."""
        return ReferenceEngine(llm_config())

    @cached_property
    def spec(self) -> Any:
        return self.embedder.describe()

    @cached_property
    def audio_encoder(self) -> Any:
        from flowstd.models import AudioEncoder, AudioEncoderConfig

        return AudioEncoder(AudioEncoderConfig(sample_rate=SAMPLE_RATE, output_hidden=llm_config().hidden_size, seed=22))

    @cached_property
    def vocoder(self) -> Any:
        from flowstd.models import Vocoder, VocoderConfig

        config = VocoderConfig(
            in_channels=llm_config().hidden_size, sample_rate=SAMPLE_RATE, block_frames=VOCODER_BLOCK_FRAMES, seed=23
        )
        return Vocoder(config)

    def pool_engines(self, pool: Any) -> PoolEngines | None:
        """The thinker's engines on `pool`, if a call made them (their counters: `batcher.stats`,
        `matcher.counters`)."""
        return self._engines.get(pool)

    def for_pool(self, kv: Any) -> PoolEngines:
        """The thinker's engines bound to `kv`'s pool (made on first use)."""
        return engines_for(self._engines, kv, self.spec, PAGE_TOKENS, PoolEngines)


class PoolEngines:
    """One KV pool's thinker: its engine, batcher, matcher and generator."""

    def __init__(self, kv: Any) -> None:
        self.engine = ReferenceEngine(llm_config())
        self.batcher = ContinuousBatcher(self.engine)
        # the matcher gets the audio rows the encoder role computed (Media with hidden=...) and
        # embeds text with the engine's own table
        self.matcher = PrefixMatcher(embed_tokens=self.engine.embed, namespace=NAMESPACE)
        self.generator = PlannedGenerator(self.engine, self.matcher, batcher=self.batcher)
        self.generator.bind(kv)


# ── audio values ──


@dataclass(frozen=True)
class AudioClip:
    """A clip of the request as mono PCM16 at SAMPLE_RATE: what crosses processes (small, picklable)."""

    index: int  # the clip's number in its request
    pcm16: bytes  # little-endian int16 samples

    @property
    def samples(self) -> int:
        return len(self.pcm16) // 2

    def waveform(self) -> Any:
        import torch

        return torch.frombuffer(bytearray(self.pcm16), dtype=torch.int16).to(torch.float32) / 32768.0

    def summary(self) -> dict:
        return {"audio": {"clip": self.index, "samples": self.samples, "sample_rate": SAMPLE_RATE}}


@dataclass(frozen=True)
class SpeechChunk:
    """A piece of the reply's speech: mono PCM16 at SAMPLE_RATE, samples `offset ..` of the reply."""

    index: int  # the chunk's number in its reply
    offset: int  # the reply's samples before it
    pcm16: bytes  # little-endian int16 samples

    @property
    def samples(self) -> int:
        return len(self.pcm16) // 2

    def summary(self) -> dict:
        import array

        values = array.array("h", self.pcm16)
        rms = (sum(v * v for v in values) / max(len(values), 1)) ** 0.5 / 32768.0
        return {
            "audio": {
                "chunk": self.index,
                "offset": self.offset,
                "samples": self.samples,
                "sample_rate": SAMPLE_RATE,
                "rms": round(rms, 2),
            }
        }


def to_pcm16(samples: Any) -> bytes:
    """float samples in [-1, 1] as little-endian int16 bytes."""
    import torch

    ints = (samples.detach().to("cpu", torch.float32).clamp(-1.0, 1.0) * 32767.0).round().to(torch.int16)
    return ints.numpy().astype("<i2").tobytes()


def audio_clip(segment: dict, index: int) -> AudioClip:
    """An audio segment: {"format": "wav", "data": base64 of a mono 16-bit WAV file}, {"format":
    "pcm16", "data": base64 of little-endian int16 samples}, or {"samples": [floats in -1..1]};
    `sample_rate`, where given, must be 16000. OpenAI's part {"type": "input_audio",
    "input_audio": {"data": ..., "format": "wav"}} is read the same way."""
    if segment.get("type") == "input_audio" and isinstance(segment.get("input_audio"), dict):
        segment = {**segment["input_audio"], "type": "audio"}
    rate = segment.get("sample_rate", SAMPLE_RATE)
    if "samples" in segment:
        import torch

        try:
            samples = torch.tensor(segment["samples"], dtype=torch.float32)
        except (TypeError, ValueError):
            raise VoiceInputError(f"segment {index}: `samples` is a list of numbers in -1..1") from None
        if samples.dim() != 1:
            raise VoiceInputError(f"segment {index}: `samples` is one flat list (mono)")
        pcm = to_pcm16(samples)
    elif "data" in segment:
        try:
            data = base64.b64decode(segment["data"], validate=True)
        except (TypeError, ValueError, binascii.Error):
            raise VoiceInputError(f"segment {index}: `data` is base64 text") from None
        kind = segment.get("format", "wav")
        if kind == "wav":
            pcm, rate = _wav_pcm16(data, index)
        elif kind == "pcm16":
            if len(data) % 2:
                raise VoiceInputError(f"segment {index}: pcm16 `data` holds {len(data)} bytes; int16 samples are 2 bytes each")
            pcm = data
        else:
            raise VoiceInputError(f"segment {index}: audio `format` is wav or pcm16, not {kind!r}")
    else:
        raise VoiceInputError(f'segment {index}: an audio segment needs `data` (base64, "format": "wav" or "pcm16") or `samples`')
    if rate != SAMPLE_RATE:
        raise VoiceInputError(
            f"segment {index}: audio at {rate} Hz; the audio encoder takes {SAMPLE_RATE} Hz (resample it first)"
        )
    samples = len(pcm) // 2
    if not MIN_SAMPLES <= samples <= MAX_CLIP_SECONDS * SAMPLE_RATE:
        raise VoiceInputError(
            f"segment {index}: a clip of {samples} samples; give {MIN_SAMPLES} to {MAX_CLIP_SECONDS * SAMPLE_RATE} "
            f"({MAX_CLIP_SECONDS} s at {SAMPLE_RATE} Hz)"
        )
    return AudioClip(index, pcm)


def _wav_pcm16(data: bytes, index: int) -> tuple[bytes, int]:
    try:
        with wave.open(io.BytesIO(data)) as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            frames = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError):
        raise VoiceInputError(f"segment {index}: `data` is not a WAV file (RIFF, PCM)") from None
    if channels != 1 or width != 2:
        raise VoiceInputError(f"segment {index}: a WAV of {channels} channel(s) of {8 * width}-bit samples; give mono 16-bit PCM")
    return frames, rate


# ── the roles ──


class Frontend:
    async def setup(self, ctx) -> None:
        self.tokenizer = VoiceRuntime.shared().tokenizer

    async def parse(self, ctx, voice_request):
        """Each audio clip as it is read (so encoding starts), then the turn's layout: `parts`,
        each {"text": ids} or {"audio": clip}, with the step and the budget."""
        request = voice_request if isinstance(voice_request, dict) else {}
        segments = request.get("segments")
        if not isinstance(segments, list) or not segments:
            told = " (this is an OpenAI chat body: the voice module takes segments)" if "messages" in request else ""
            raise VoiceInputError(
                'the request is {"segments": [{"type": "audio", "format": "wav", "data": base64}, '
                '{"type": "text", "text": ...}], "max_tokens": N, "step": S}' + told
            )
        budget = request.get("max_tokens", DEFAULT_MAX_TOKENS)
        if not isinstance(budget, int) or isinstance(budget, bool) or not 1 <= budget <= MAX_TOKENS:
            raise VoiceInputError(f"max_tokens is a whole number from 1 to {MAX_TOKENS}, not {budget!r}")
        step = request.get("step")
        if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
            raise VoiceInputError(f"step is the position the client holds (a whole number), not {step!r}")
        special = self.tokenizer.special_ids
        user, close = [special["<|user|>"]], [special["<|eos|>"], special["<|assistant|>"]]
        parts: list[dict] = []
        clips = 0
        in_user = False
        for index, segment in enumerate(segments):
            kind = segment.get("type") if isinstance(segment, dict) else None
            if kind == "reply":
                if not in_user:
                    raise VoiceInputError(f"segment {index}: a reply answers a user turn; give the user's segments before it")
                ids = token_ids(segment.get("tokens"), f"segment {index}'s tokens", self.tokenizer.vocab_size)
                _text(parts, close + ids)
                in_user = False
                continue
            if not in_user:
                _text(parts, user)
                in_user = True
            if kind in ("audio", "input_audio"):
                yield {"voice_audio": audio_clip(segment, clips)}
                parts.append({"audio": clips})
                clips += 1
            elif kind == "text" and isinstance(segment.get("text"), str):
                _text(parts, self.tokenizer.encode(segment["text"]))
            else:
                raise VoiceInputError(f"segment {index}: give type `audio`, `text` (with a `text` string) or `reply`")
        if not in_user:
            raise VoiceInputError("the request ends with a reply: end it with the user's turn (audio or text)")
        _text(parts, close)
        yield {"voice_prompt": {"parts": parts, "clips": clips, "step": step, "max_tokens": budget}}


def _text(parts: list[dict], ids: list[int]) -> None:
    """Append text ids, joining them to a text part just before."""
    if parts and "text" in parts[-1]:
        parts[-1]["text"] = parts[-1]["text"] + list(ids)
    elif ids:
        parts.append({"text": list(ids)})


class AudioEncoderRole:
    """The encoder's weights are the process's; its cache is the replica's (`self.cache`), so a
    deployment starts with an empty one, whatever ran in the process before."""

    async def setup(self, ctx) -> None:
        VoiceRuntime.shared().build("audio_encoder")
        self.cache = EncoderCache(name="audio")

    async def encode(self, ctx, voice_audio):
        from flowstd.models import tensor_content_hash

        runtime = VoiceRuntime.shared()
        waveform = voice_audio.waveform()
        content = tensor_content_hash(waveform)
        cache = self.cache.state(content)  # hit, join (another request is encoding it) or miss
        rows = await self.cache.get(content, lambda: runtime.audio_encoder.encode(waveform))
        return {"audio_emb": {"clip": voice_audio.index, "content": content, "hidden": rows, "cache": cache}}


class Thinker:
    async def setup(self, ctx) -> None:
        runtime = VoiceRuntime.shared()
        check_kv_fits(ctx, runtime.spec, page_tokens=PAGE_TOKENS, model="the voice thinker (flowstd.roles.voice)")
        runtime.build("tokenizer")

    async def generate(self, ctx, voice_prompt, audio_emb=()):
        runtime = VoiceRuntime.shared()
        prompt = voice_prompt[0] if isinstance(voice_prompt, list) else voice_prompt
        encoded = {item["clip"]: item for item in audio_emb}
        if sorted(encoded) != list(range(prompt["clips"])):
            raise VoiceInputError(f"the thinker got clips {sorted(encoded)} of {prompt['clips']}")
        items = [
            Text(part["text"])
            if "text" in part
            else Media("audio", content=encoded[part["audio"]]["content"], hidden=encoded[part["audio"]]["hidden"])
            for part in prompt["parts"]
        ]
        budget, eos = prompt["max_tokens"], runtime.tokenizer.eos_id

        async def run(on_token):
            async with ctx.kv(GLOBAL) as kv:
                engines = runtime.for_pool(kv)
                plan = await engines.matcher.incremental(kv, items, step=prompt["step"])
                result = await engines.generator.generate(kv, plan, max_new_tokens=budget, stop={eos}, on_token=on_token)
                return plan, result

        detokenizer = runtime.tokenizer.stream_detokenizer()
        generated: list[int] = []
        async for item in stream_generation(run):
            if not isinstance(item, int):
                plan, result = item  # the last item
                continue
            last = item == eos or len(generated) + 1 == budget
            text = detokenizer.push(item) + (detokenizer.finish() if last else "")
            frame: dict[str, Any] = {"spoken": {"token": item, "index": len(generated), "last": last}}
            if text:
                frame["reply"] = text
            generated.append(item)
            yield frame
        yield {
            "turn": {
                "prompt_tokens": result.prompt_tokens,
                "reused_tokens": result.reused_tokens,
                "computed_tokens": result.computed_tokens,
                "hit_pages": plan.hit.pages,
                "generated_tokens": len(generated),
                "history_tokens": plan.n_tokens + len(generated),  # the `step` of a client holding this turn
                "audio_clips": prompt["clips"],
                "audio_cache_hits": sum(item["cache"] != "miss" for item in encoded.values()),  # no forward of its own
                "finish_reason": "stop" if generated and generated[-1] == eos else "length",
                "reply_tokens": generated,
            }
        }


@dataclass
class _Speaking:
    stream: Any  # the reply's VocoderStream
    next_index: int = 0  # the token it expects next
    chunks: int = 0
    offset: int = 0  # samples sent


class Talker:
    async def setup(self, ctx) -> None:
        VoiceRuntime.shared().build("vocoder", "embedder", "tokenizer")
        self.streams: OrderedDict[tuple, _Speaking] = OrderedDict()

    async def speak(self, ctx, spoken):
        """The speech the token completes: the vocoder's blocks whose window has now arrived (none
        for most tokens), and at the reply's last token the rest."""
        import torch

        runtime = VoiceRuntime.shared()
        key = (ctx.session, ctx.call_id)
        state = self.streams.pop(key, None)
        if state is None:
            state = _Speaking(runtime.vocoder.stream())
        if spoken["index"] != state.next_index:
            raise VoiceInputError(
                f"the talker got token {spoken['index']} of the reply, expecting {state.next_index}: "
                "its tokens must come in order (lb session)"
            )
        token = spoken["token"]
        if token in runtime.tokenizer.special_id_set:  # <|eos|> and the like say nothing
            features = torch.zeros(0, runtime.spec.hidden_size)
        else:
            features = runtime.embedder.embed([token]).to(torch.float32).repeat(FRAMES_PER_TOKEN, 1)
        samples = state.stream.push(features)
        if spoken["last"]:
            samples = torch.cat([samples, state.stream.finish()])
        else:
            state.next_index += 1
            self.streams[key] = state
            while len(self.streams) > MAX_STREAMS:
                self.streams.popitem(last=False)
        if samples.numel():
            chunk = SpeechChunk(state.chunks, state.offset, to_pcm16(samples))
            state.chunks += 1
            state.offset += chunk.samples
            yield {"speech": chunk}
