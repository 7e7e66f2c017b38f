"""The roles of lib/voice.flow: omni voice chat on real tiny models (docs/stdlib.md, "The `voice` module").

    Frontend.parse           voice_request -> stream voice_audio (one per clip, as it is read),
                             then voice_prompt (the turn's layout: text ids and clip numbers);
                             segments, or an OpenAI chat body (the whole conversation, step 0);
                             WAV/FLAC/OGG files decoded and resampled by flowrt.media
    AudioEncoderRole.encode  voice_audio -> audio_emb: the clip's AudioEncoder rows, cached by
                             the clip's content hash, and what the cache did (hit, join, miss);
                             clips of concurrent turns run in one forward (`AudioEncoderBatcher`)
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
the whole reply (bit for bit alone; to rounding in a shared `VocoderBatcher` forward). A stream
lives in the talker's replica, keyed by the session and call (`lb session` keeps them there, in
order); at most MAX_STREAMS are held, the oldest dropped.

Models come from seeds (docs/models.md): every process builds the same ones, lazily, only those
its role needs (`VoiceRuntime.shared()`). Outputs are untrained: the text is gibberish and the
speech noise, but every step of serving is real and deterministic.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from flowrt.compute.encoder_cache import EncoderCache
from flowrt.compute.engine import ContinuousBatcher, ReferenceConfig, ReferenceEngine
from flowrt.compute.engine.planned import PlannedGenerator
from flowrt.compute.prefix import Media, PrefixMatcher, Text
from flowrt.errors import BadInput, FlowrtError
from flowstd.models.audio_batch import AudioEncoderBatcher
from flowstd.models.vocoder_batch import VocoderBatcher
from flowstd.roles.delivered import SpokenTurns
from flowstd.roles.llm import check_kv_fits, engines_for, stream_generation, token_ids

GLOBAL = "kv"  # the KVCache global lib/voice.flow imports (lib/kvcache.flow)
PAGE_TOKENS = 16
SAMPLE_RATE = 16000  # audio out, and in: other rates are resampled (flowrt.media.resample)
MIN_SAMPLES = 201  # the audio encoder's shortest clip (AudioEncoderConfig.min_samples: n_fft // 2 + 1)
DEFAULT_MAX_TOKENS = 24  # the reply's budget when the request sets no max_tokens
MAX_TOKENS = 512
FRAMES_PER_TOKEN = 4  # the talker's duration model: 4 vocoder frames (40 ms) of speech per token
VOCODER_BLOCK_FRAMES = 8  # a block of speech (80 ms) is final once 8 + 7 (context) frames arrived
MAX_STREAMS = 256  # talker streams a replica holds (a call cancelled mid-reply leaves one behind)
NAMESPACE = "flowstd.voice"  # roots the thinker's page chains: no other model shares its pages


class VoiceInputError(BadInput):
    """A request the voice roles cannot read: the message names the fix."""


class VoiceStateError(FlowrtError, RuntimeError):
    """The voice roles lost state a call needed (not the caller's doing: a 500)."""


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

    def media(self) -> dict:
        """The clip in full, as a PCM16 WAV (events with `summarize(value, media=True)`)."""
        return _wav(self.pcm16, clip=self.index)


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

    def media(self) -> dict:
        """The chunk in full, as a PCM16 WAV of exactly its samples (events with `summarize(value, media=True)`)."""
        return _wav(self.pcm16, chunk=self.index, offset=self.offset)


def _wav(pcm: bytes, **fields: int) -> dict:
    from flowrt import media

    return media.carried("wav", media.encode_wav(pcm, SAMPLE_RATE), sample_rate=SAMPLE_RATE, samples=len(pcm) // 2, **fields)


def to_pcm16(samples: Any) -> bytes:
    """float samples in [-1, 1] as little-endian int16 bytes."""
    import torch

    ints = (samples.detach().to("cpu", torch.float32).clamp(-1.0, 1.0) * 32767.0).round().to(torch.int16)
    return ints.numpy().astype("<i2").tobytes()


def audio_clip(segment: dict, index: int, where: str | None = None) -> AudioClip:
    """Clip number `index` of a request: {"format": "wav" (or "flac", "ogg"), "data": base64 of the
    file or a data URL}, {"format": "pcm16", "data": base64 of little-endian int16 samples}, or
    {"samples": [floats in -1..1]}; `sample_rate` (pcm16 and samples: default 16000) and files at
    other rates are resampled to 16 kHz, files of several channels mixed to one (flowrt.media).
    OpenAI's part {"type": "input_audio", "input_audio": {"data": ..., "format": "wav"}} is read
    the same way. `where` names the segment in errors (default `segment INDEX`)."""
    from flowrt import media

    where = f"segment {index}" if where is None else where
    if segment.get("type") == "input_audio" and isinstance(segment.get("input_audio"), dict):
        segment = {**segment["input_audio"], "type": "audio"}
    rate = segment.get("sample_rate", SAMPLE_RATE)
    if not isinstance(rate, int) or isinstance(rate, bool) or rate < 1:
        raise VoiceInputError(f"{where}: `sample_rate` is a whole number of Hz, not {rate!r}")
    try:
        if "samples" in segment:
            pcm = _listed_samples(segment["samples"], rate, where)
        elif "data" in segment:
            kind = segment.get("format", "wav")
            data = media.media_bytes(segment["data"], part=where, kind="audio")
            if kind == "pcm16":
                if len(data) % 2:
                    raise VoiceInputError(f"{where}: pcm16 `data` holds {len(data)} bytes; int16 samples are 2 bytes each")
                _check_length(len(data) // 2, rate, where)
                pcm = data if rate == SAMPLE_RATE else media.pcm16(media.resample(_floats(data), rate, SAMPLE_RATE))
            elif kind in AUDIO_FORMATS:
                pcm = media.pcm16(media.decode_audio(data, sample_rate=SAMPLE_RATE, part=where).samples)
            else:
                raise VoiceInputError(f"{where}: audio `format` is {', '.join(AUDIO_FORMATS)} or pcm16, not {kind!r}")
        else:
            raise VoiceInputError(
                f'{where}: an audio segment needs `data` (base64, "format": "wav", "flac", "ogg" or "pcm16") or `samples`'
            )
    except media.MediaError as error:
        raise VoiceInputError(str(error)) from None
    _check_length(len(pcm) // 2, SAMPLE_RATE, where, shortest=MIN_SAMPLES)
    return AudioClip(index, pcm)


def _check_length(samples: int, rate: int, where: str, shortest: int = 0) -> None:
    """A clip of `samples` at `rate` Hz is within the duration limit (raw audio: before it is
    resampled) and, at 16 kHz, long enough for the audio encoder."""
    from flowrt import media

    limits = media.media_limits()
    most = int(limits.max_audio_seconds * rate)
    if not shortest <= samples <= most:
        raise VoiceInputError(
            f"{where}: a clip of {samples} samples at {rate} Hz; give {shortest or 1} to {most} "
            f"({limits.max_audio_seconds:g} s: {limits.name('max_audio_seconds')})"
        )


AUDIO_FORMATS = ("wav", "flac", "ogg")  # the files a segment's `format` may name (flowrt.media reads them)


def _floats(pcm: bytes) -> Any:
    import numpy

    return numpy.frombuffer(pcm, dtype="<i2").astype(numpy.float32) / 32768.0


def _listed_samples(values: Any, rate: int, where: str) -> bytes:
    import torch

    from flowrt import media

    try:
        samples = torch.tensor(values, dtype=torch.float32)
    except (TypeError, ValueError):
        raise VoiceInputError(f"{where}: `samples` is a list of numbers in -1..1") from None
    if samples.dim() != 1:
        raise VoiceInputError(f"{where}: `samples` is one flat list (mono)")
    _check_length(len(samples), rate, where)
    if rate != SAMPLE_RATE:
        samples = torch.from_numpy(media.resample(samples.numpy(), rate, SAMPLE_RATE))
    return to_pcm16(samples)


# ── the roles ──


class Frontend:
    prompt_field, audio_field = "voice_prompt", "voice_audio"  # where the layout and each clip go
    images, image_field = False, ""  # whether image parts are read, and where they go (flowstd.roles.omni)

    async def setup(self, ctx) -> None:
        self.tokenizer = VoiceRuntime.shared().tokenizer

    async def parse(self, ctx, voice_request):
        async for frame in self.frames(voice_request):
            yield frame

    async def frames(self, request):
        """Each audio clip (and, with `images`, each image) as it is read, so encoding starts;
        then the turn's layout: `parts`, each {"text": ids}, {"audio": clip} or {"image":
        content hash}, with the step and the budget."""
        segments, budget, step = voice_segments(request, images=self.images)
        special = self.tokenizer.special_ids
        user, close = [special["<|user|>"]], [special["<|eos|>"], special["<|assistant|>"]]
        parts: list[dict] = []
        clips = 0
        in_user = False
        for where, segment in segments:
            kind = segment.get("type") if isinstance(segment, dict) else None
            if kind == "reply":
                if not in_user:
                    raise VoiceInputError(f"{where}: a reply answers a user turn; give the user's segments before it")
                if "tokens" not in segment and isinstance(segment.get("text"), str):
                    ids = self.tokenizer.encode(segment["text"])
                else:
                    ids = token_ids(segment.get("tokens"), f"{where}'s tokens", self.tokenizer.vocab_size)
                _text(parts, close + ids)
                in_user = False
                continue
            if not in_user:
                _text(parts, user)
                in_user = True
            if kind in ("audio", "input_audio"):
                yield {self.audio_field: await asyncio.to_thread(audio_clip, segment, clips, where)}  # decoding off the loop
                parts.append({"audio": clips})
                clips += 1
            elif kind == "text" and isinstance(segment.get("text"), str):
                _text(parts, self.tokenizer.encode(segment["text"]))
            elif kind in ("image", "image_url") and self.images:
                image, content = await asyncio.to_thread(_image, segment, where)
                yield {self.image_field: image}
                parts.append({"image": content})
            else:
                media = "`audio`, `image`" if self.images else "`audio`"
                raise VoiceInputError(f"{where}: give type {media}, `text` (with a `text` string) or `reply`")
        if not in_user:
            raise VoiceInputError("the request ends with a reply: end it with the user's turn (audio or text)")
        _text(parts, close)
        yield {self.prompt_field: {"parts": parts, "clips": clips, "step": step, "max_tokens": budget}}


def _image(segment: Any, where: str) -> tuple[Any, str]:
    """An image segment decoded (flowstd.roles.multimodal), with the content hash its ViT rows are keyed by."""
    from flowstd.models import tensor_content_hash
    from flowstd.roles.multimodal import MultimodalInputError, image_payload

    try:
        image = image_payload(segment, where)
    except MultimodalInputError as error:
        raise VoiceInputError(str(error)) from None
    return image, tensor_content_hash(image.pixels())


def voice_segments(request: Any, images: bool = False) -> tuple[list[tuple[str, Any]], int, int | None]:
    """The request's segments, each with the name errors give it, its budget and its step: from
    {"segments": [...], "max_tokens": N, "step": S}, or from an OpenAI chat body (or its list of
    messages): the whole conversation (step 0), each user message's text and audio parts as
    segments, each assistant message's text as a `reply` (tokenized), system and developer
    messages' text as text of the user turn they begin; `max_completion_tokens` (else
    `max_tokens`) is the budget. With `images`, image parts are segments too."""
    if isinstance(request, dict) and isinstance(request.get("segments"), list) and request["segments"]:
        segments = [(f"segment {index}", segment) for index, segment in enumerate(request["segments"])]
        key, step = "max_tokens", request.get("step")
    elif isinstance(request, list) or (isinstance(request, dict) and "messages" in request):
        segments, step = _chat_segments(request, images), 0
        key = "max_completion_tokens" if isinstance(request, dict) and "max_completion_tokens" in request else "max_tokens"
    else:
        raise VoiceInputError(
            'the request is {"segments": [{"type": "audio", "format": "wav", "data": base64}, '
            '{"type": "text", "text": ...}], "max_tokens": N, "step": S}, or an OpenAI chat body, {"messages": [...]}'
        )
    budget = request.get(key, DEFAULT_MAX_TOKENS) if isinstance(request, dict) else DEFAULT_MAX_TOKENS
    if not isinstance(budget, int) or isinstance(budget, bool) or not 1 <= budget <= MAX_TOKENS:
        raise VoiceInputError(f"{key} is a whole number from 1 to {MAX_TOKENS}, not {budget!r}")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        raise VoiceInputError(f"step is the position the client holds (a whole number), not {step!r}")
    return segments, budget, step


def _chat_segments(body: Any, images: bool) -> list[tuple[str, Any]]:
    from flowstd.tokenizer.chat import ChatTemplateError, chat_messages, chat_parts

    try:
        messages, parts = chat_messages(body), chat_parts(body)
    except ChatTemplateError as error:
        raise VoiceInputError(str(error)) from None
    by_message: dict[int, list] = {}
    for part in parts:
        by_message.setdefault(part.message, []).append(part)
    segments: list[tuple[str, Any]] = []
    for index, message in enumerate(messages):
        mine = by_message.get(index, [])
        if message["role"] == "assistant":  # its text, joined, is the reply
            if any(part.kind != "text" for part in mine):
                where = next(part.where for part in mine if part.kind != "text")
                raise VoiceInputError(f"{where}: media in an assistant message; give the reply's transcript as text")
            text = "".join(part.value for part in mine)
            if not text:
                raise VoiceInputError(
                    f"messages[{index}]: an assistant message without text (its audio by id is not kept here); "
                    "give the reply's transcript as its content"
                )
            segments.append((f"messages[{index}]", {"type": "reply", "text": text}))
            continue
        for part in mine:
            if part.kind == "image" and not images:
                raise VoiceInputError(
                    f"{part.where}: an image part; the voice module reads text and audio "
                    "(the multimodal module reads images, the omni module all three)"
                )
            kinds = {"audio": ("input_audio", "input_audio"), "image": ("image_url", "image_url"), "text": ("text", "text")}
            kind, key = kinds.get(part.kind, ("text", "text"))
            segments.append((part.where, {"type": kind, key: part.value}))
    return segments


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
        runtime = VoiceRuntime.shared().build("audio_encoder")
        self.cache = EncoderCache(name="audio")
        self.clips = AudioEncoderBatcher(runtime.audio_encoder)  # the clips of turns heard at once, together

    async def encode(self, ctx, voice_audio):
        from flowstd.models import tensor_content_hash

        waveform = voice_audio.waveform()
        content = tensor_content_hash(waveform)
        cache = self.cache.state(content)  # hit, join (another request is encoding it) or miss
        rows = await self.cache.get(content, lambda: self.clips.encode(waveform))
        return {"audio_emb": {"clip": voice_audio.index, "content": content, "hidden": rows, "cache": cache}}


class Thinker:
    reply_field, turn_field = "reply", "turn"  # where the text and the counts go

    async def setup(self, ctx) -> None:
        runtime = VoiceRuntime.shared()
        check_kv_fits(ctx, runtime.spec, page_tokens=PAGE_TOKENS, model="the voice thinker (flowstd.roles.voice)")
        runtime.build("tokenizer")
        self.spoken = SpokenTurns(VOCODER_BLOCK_FRAMES // FRAMES_PER_TOKEN)  # (an interrupted turn: what was heard)

    async def generate(self, ctx, voice_prompt, audio_emb=()):
        async for frame in self.think(ctx, voice_prompt, audio_emb, ()):
            yield frame

    async def think(self, ctx, prompt, audio_emb, vit_emb):
        """The turn: its layout's text, audio clips' rows and images' ViT rows (by content hash)."""
        runtime = VoiceRuntime.shared()
        prompt = prompt[0] if isinstance(prompt, list) else prompt
        encoded = {item["clip"]: item for item in audio_emb}
        if sorted(encoded) != list(range(prompt["clips"])):
            raise VoiceInputError(f"the thinker got clips {sorted(encoded)} of {prompt['clips']}")
        seen = {item["content"]: item for item in vit_emb}
        missing = [part["image"] for part in prompt["parts"] if "image" in part and part["image"] not in seen]
        if missing:
            raise VoiceInputError(f"the thinker got no ViT rows for {len(missing)} of the turn's images")

        def as_item(part: dict) -> Any:
            if "text" in part:
                return Text(part["text"])
            if "image" in part:
                return Media("image", content=part["image"], hidden=seen[part["image"]]["hidden"])
            return Media("audio", content=encoded[part["audio"]]["content"], hidden=encoded[part["audio"]]["hidden"])

        items = [as_item(part) for part in prompt["parts"]]
        budget, eos = prompt["max_tokens"], runtime.tokenizer.eos_id
        step = prompt["step"]
        if step is None:  # after a turn this call interrupted: its reply as far as the user heard it
            step = self.spoken.step(ctx.session, getattr(ctx, "interrupted", None), self.reply_field)
        turn = self.spoken.start(ctx.session, ctx.call_id)

        async def run(on_token):
            async with ctx.kv(GLOBAL) as kv:
                engines = runtime.for_pool(kv)
                plan = await engines.matcher.incremental(kv, items, step=step)
                turn["history"] = plan.n_tokens
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
                frame[self.reply_field] = text
            generated.append(item)
            turn["texts"].append(bool(text))
            yield frame
        yield {
            self.turn_field: {
                "prompt_tokens": result.prompt_tokens,
                "reused_tokens": result.reused_tokens,
                "computed_tokens": result.computed_tokens,
                "hit_pages": plan.hit.pages,
                "generated_tokens": len(generated),
                "completion_tokens": len(generated),  # (OpenAI's name: /v1/chat/completions reports it as usage)
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
        runtime = VoiceRuntime.shared().build("vocoder", "embedder", "tokenizer")
        self.streams: OrderedDict[tuple, _Speaking] = OrderedDict()
        self.broken: OrderedDict[tuple, None] = OrderedDict()  # replies whose stream was lost here
        self.blocks = VocoderBatcher(runtime.vocoder)  # the blocks of the replies it speaks at once, together

    def statistics(self) -> dict[str, int]:
        return {"streams_held": len(self.streams), **{f"vocoder_{k}": v for k, v in self.blocks.statistics().items()}}

    async def speak(self, ctx, spoken):
        """The speech the token completes: the blocks whose window has now arrived (none for most
        tokens; at the last token, the rest), synthesized with other replies' (`VocoderBatcher`)."""
        import torch

        runtime = VoiceRuntime.shared()
        key = (ctx.session, ctx.call_id)
        if key in self.broken:  # this reply's stream is lost: its error was reported once, at the first token
            return
        state = self.streams.pop(key, None)
        if state is None:
            state = _Speaking(runtime.vocoder.stream())
        if spoken["index"] != state.next_index:
            self.broken[key] = None
            while len(self.broken) > MAX_STREAMS:
                self.broken.popitem(last=False)
            # not the caller's doing: the stream's replica went away, or tokens came out of order (no `lb session`)
            raise VoiceStateError(
                f"the talker got token {spoken['index']} of the reply, expecting {state.next_index}: the reply's "
                "speech stream is not here (its replica restarted mid-reply?); the rest of this reply is not spoken"
            )
        token = spoken["token"]
        if token in runtime.tokenizer.special_id_set:  # <|eos|> and the like say nothing
            features = torch.zeros(0, runtime.spec.hidden_size)
        else:
            features = runtime.embedder.embed([token]).to(torch.float32).repeat(FRAMES_PER_TOKEN, 1)
        windows = state.stream.windows(features)
        if spoken["last"]:
            windows += state.stream.final_windows()
        else:
            state.next_index += 1
            self.streams[key] = state
            while len(self.streams) > MAX_STREAMS:
                self.streams.popitem(last=False)
        if not windows:
            return
        index, offset = state.chunks, state.offset
        state.chunks += 1
        state.offset += sum(window.samples for window in windows)
        samples = await self.blocks.synthesize(windows)
        yield {"speech": SpeechChunk(index, offset, to_pcm16(samples))}
