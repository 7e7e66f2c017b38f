"""The roles of lib/multimodal.flow: an any-to-any pipeline of real tiny models (docs/stdlib.md).

    Frontend.parse      request -> text_seg, image_seg (one frame per segment, in order): segments,
                        or an OpenAI chat body's text and image parts; PNG/JPEG/WebP files are
                        decoded by flowrt.media (GeneratedImage and ImagePayload go out as PNGs)
    Embed.encode        text_seg -> txt_emb: the segment's token ids and their LLM embeddings
    Vit.encode          image_seg -> vit_emb: the image's VisionEncoder rows, its content hash,
                        and whether this replica's encoder cache held them
    Vae.encode/decode   image_seg -> vae_lat (a latent); latent -> image
    Llm.generate        txt_emb | vit_emb & vae_lat -> stream token, usage, hidden (the role `mm_llm`):
                        text through the streaming detokenizer (whole characters), `usage`
                        with the call's prompt and completion tokens so far
    Dit.denoise         hidden, vit_emb (all), vae_lat (all) -> latent

The LLM is flowrt's reference engine (vocabulary of flowstd's tokenizer, hidden 64), driven by a
`PlannedGenerator` from `PrefixMatcher` plans over the pool of `global kv`: each activation
appends its segment to the session's history (incremental matching), reuses the pages the pool
holds (turn 1's, in turn 2), prefills the rest and decodes a few greedy tokens. Its `hidden`
carries what the DiT needs: the final hidden state, the context's input rows and its page keys.
The DiT (`flowrt.compute.engine.dit`) attends to the LLM's cached text K/V of that context, read
from the pool by slot: in the LLM's process the pages are there; in another process
(`--deploy local`) they are recomputed from the rows (`place_context`), giving the same K/V.

The media models, the tokenizer and the encoder cache are built once per process
(`MultimodalRuntime.shared()`, in the roles' `setup`); the LLM engine, its ContinuousBatcher, the
matcher and the DiT once per process and KV pool (`PoolEngines`, on a role's first `ctx.kv`),
so the mm_llm and dit roles of one process share them. The global's settings must be the
engine's (`llm_global_settings()`, lib/kvcache.flow's shape): the two roles check it in `setup`,
so a global of another shape stops the deployment from starting, naming both shapes and the
settings to change.
Weights come from seeds: every process builds the same models, and outputs are deterministic.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from flowrt.compute.encoder_cache import EncoderCache
from flowrt.compute.engine import ContinuousBatcher, EngineError, ReferenceConfig, ReferenceEngine, kv_stacks
from flowrt.compute.engine.dit import DitConfig, DitEngine, DitSampler
from flowrt.compute.engine.planned import PlannedGenerator, place_context
from flowrt.compute.prefix import Media, PrefixMatcher, Text
from flowrt.errors import BadInput
from flowstd.roles.llm import check_kv_fits, engines_for

GLOBAL = "kv"  # the KVCache global lib/multimodal.flow imports (lib/kvcache.flow)
PAGE_TOKENS = 16
IMAGE_SIZE = 32  # images are resized and cropped to this square (16 ViT rows, a 4x4 latent)
NEW_TOKENS = 4  # tokens the LLM generates per activation
DIT_STEPS = 4


class MultimodalInputError(BadInput):
    """A request the multimodal roles cannot read: the message names the fix."""


def llm_config() -> ReferenceConfig:
    """The LLM: the reference engine over flowstd's tokenizer vocabulary (3072 ids)."""
    return ReferenceConfig(vocab_size=3072, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, seed=11)


def llm_global_settings() -> dict[str, Any]:
    """What `global kv: KVCache { ... }` must say to hold the LLM's (and so the DiT's) K/V."""
    return ReferenceEngine(llm_config()).describe().global_settings(PAGE_TOKENS)


class MultimodalRuntime:
    """This process's models: the ViT, the VAE, the tokenizer, the LLM's weights (for embedding),
    and per KV pool the engines bound to it (`for_pool`); see the module docstring."""

    _shared: MultimodalRuntime | None = None

    @classmethod
    def shared(cls) -> MultimodalRuntime:
        if cls._shared is None:
            cls._shared = cls()
        return cls._shared

    def __init__(self) -> None:
        from flowstd.models import Vae, VaeConfig, VisionEncoder, VisionEncoderConfig
        from flowstd.tokenizer import Tokenizer

        self.tokenizer = Tokenizer.load()
        self.embedder = ReferenceEngine(llm_config())  # embeddings only: never bound to a pool
        self.spec = self.embedder.describe()
        if self.tokenizer.vocab_size > self.spec.vocab_size:
            raise EngineError(f"the LLM's vocabulary ({self.spec.vocab_size}) is smaller than the tokenizer's")
        self.vit = VisionEncoder(VisionEncoderConfig(image_size=IMAGE_SIZE, output_hidden=self.spec.hidden_size, seed=13))
        self.vae = Vae(VaeConfig(image_size=IMAGE_SIZE, seed=14))
        self.vit_cache = EncoderCache(name="image")
        # a deployment's pool lives as long as the deployment; a process may open several in turn (tests)
        self._engines: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def for_pool(self, kv: Any) -> PoolEngines:
        """The engines bound to `kv`'s pool (made on first use), refusing a global of the wrong shape."""
        return engines_for(self._engines, kv, self.spec, PAGE_TOKENS, PoolEngines)


class PoolEngines:
    """One KV pool's LLM engine, its batcher, matcher and generator, and the DiT reading its K/V."""

    def __init__(self, kv: Any) -> None:
        self.engine = ReferenceEngine(llm_config())
        spec = self.engine.describe()
        self.batcher = ContinuousBatcher(self.engine)
        # the matcher is given the rows upstream roles computed (Text/Media with hidden=...), so it
        # needs no encoder; embed_tokens embeds what the LLM generated
        self.matcher = PrefixMatcher(embed_tokens=self.engine.embed, namespace="flowstd.multimodal")
        self.generator = PlannedGenerator(self.engine, self.matcher, batcher=self.batcher)
        self.generator.bind(kv)
        self.dit = DitEngine(DitConfig.matching(spec, seed=12))
        self.dit.check_llm(spec)
        self.dit.bind_kv(kv_stacks(kv))
        self.sampler = DitSampler(self.dit, batcher=ContinuousBatcher(self.dit))


# ── requests ──


@dataclass(frozen=True)
class ImagePayload:
    """An image as raw RGB bytes: what crosses processes between roles (picklable)."""

    width: int
    height: int
    data: bytes

    def pixels(self) -> Any:
        import torch

        return torch.frombuffer(bytearray(self.data), dtype=torch.uint8).view(self.height, self.width, 3)

    def summary(self) -> dict:
        return {"image": {"width": self.width, "height": self.height, "mode": "RGB"}}

    def media(self) -> dict:
        """The image in full, as a PNG (events with `summarize(value, media=True)`)."""
        from flowrt import media

        return media.carried("png", media.encode_png(self.data, self.width, self.height), width=self.width, height=self.height)


def image_payload(segment: Any, where: str = "an image segment") -> ImagePayload:
    """An image segment: decoded pixels, {"pixels": nested lists (H, W, 3) of 0..255} or {"width": W,
    "height": H, "base64": raw RGB bytes, row-major}; or a PNG, JPEG or WebP file, {"url": a data
    URL}, {"base64": the file} (no width and height) or OpenAI's part {"type": "image_url",
    "image_url": {"url": ...}}. `where` names the segment in errors."""
    if not isinstance(segment, dict):
        raise MultimodalInputError(
            f"{where}: an image segment is an object with `pixels`, `url` or `base64`, not {type(segment).__name__}"
        )
    if segment.get("type") == "image_url":
        source = segment.get("image_url")
        return decoded_image(source.get("url") if isinstance(source, dict) else source, where)
    if "pixels" in segment:
        rows = segment["pixels"]
        try:
            height, width = len(rows), len(rows[0])
            flat = bytes(int(channel) for row in rows for pixel in row for channel in pixel)
        except (TypeError, ValueError, IndexError):
            raise MultimodalInputError(f"{where}: an image's `pixels` are rows of [r, g, b] lists of ints 0..255") from None
        if len(flat) != height * width * 3:
            raise MultimodalInputError(f"{where}: an image's `pixels` must be {height} rows of {width} [r, g, b] pixels")
        return ImagePayload(width, height, flat)
    if "base64" in segment and ("width" in segment or "height" in segment):
        try:
            width, height = int(segment["width"]), int(segment["height"])
            data = base64.b64decode(segment["base64"], validate=True)
        except (KeyError, TypeError, ValueError, binascii.Error):
            raise MultimodalInputError(f"{where}: a raw image needs `width`, `height` and `base64` (RGB bytes)") from None
        if len(data) != width * height * 3 or width < 1 or height < 1:
            raise MultimodalInputError(
                f"{where}: a {width}x{height} RGB image is {width * height * 3} bytes; `base64` holds {len(data)}"
            )
        return ImagePayload(width, height, data)
    if "url" in segment or "base64" in segment:
        return decoded_image(segment.get("url", segment.get("base64")), where)
    raise MultimodalInputError(
        f"{where}: an image segment needs `url` (a data URL), `base64` (a PNG, JPEG or WebP file), "
        "`pixels` (rows of [r, g, b]) or `width`, `height`, `base64` (raw RGB)"
    )


def decoded_image(source: Any, where: str) -> ImagePayload:
    """A PNG, JPEG or WebP file given as a data URL or base64 (flowrt.media: its formats and limits)."""
    from flowrt import media

    try:
        image = media.decode_image(media.media_bytes(source, part=where, kind="image"), part=where)
    except media.MediaError as error:
        raise MultimodalInputError(str(error)) from None
    return ImagePayload(image.width, image.height, image.rgb)


def _segments(request: Any) -> list[tuple[str, Any]]:
    """The request's segments, each with the name errors give it: {"segments": [...]}, an OpenAI
    chat body (or its list of messages), whose text and image parts become segments in order, or
    an OpenAI images body, whose `prompt` is the one text segment (text to image)."""
    if isinstance(request, dict) and isinstance(request.get("prompt"), str) and "messages" not in request:
        return [("the prompt", {"type": "text", "text": request["prompt"]})]
    if isinstance(request, dict) and "segments" in request:
        segments = request["segments"]
        if isinstance(segments, list) and segments:
            return [(f"segment {index}", segment) for index, segment in enumerate(segments)]
    elif isinstance(request, list) or (isinstance(request, dict) and "messages" in request):
        return _chat_segments(request)
    raise MultimodalInputError(
        'the request is {"segments": [{"type": "text", "text": ...}, {"type": "image", ...}]} '
        'or an OpenAI chat body, {"messages": [...]}'
    )


def _chat_segments(body: Any) -> list[tuple[str, Any]]:
    from flowstd.tokenizer.chat import ChatTemplateError, chat_parts

    try:
        parts = chat_parts(body)
    except ChatTemplateError as error:
        raise MultimodalInputError(str(error)) from None
    segments: list[tuple[str, Any]] = []
    for part in parts:
        if part.kind == "audio":
            raise MultimodalInputError(
                f"{part.where}: an audio part; the multimodal module reads text and images (the voice module reads audio)"
            )
        segment = {"type": "text", "text": part.value} if part.kind == "text" else {"type": "image_url", "image_url": part.value}
        segments.append((part.where, segment))
    if not segments:
        raise MultimodalInputError("the messages hold no text or image to read")
    return segments


# ── the roles ──


class Frontend:
    async def parse(self, ctx, request):
        frames = []  # every segment is read before the first goes out: a bad one fails the call whole
        for index, (where, segment) in enumerate(_segments(request)):
            kind = segment.get("type") if isinstance(segment, dict) else None
            if kind == "text" and isinstance(segment.get("text"), str):
                frames.append({"text_seg": {"text": segment["text"], "index": index}})
            elif kind in ("image", "image_url"):
                # decoding off the event loop: a large PNG takes a while (Pillow releases the GIL)
                frames.append({"image_seg": await asyncio.to_thread(image_payload, segment, where)})
            else:
                raise MultimodalInputError(f"{where}: give type `text` with a `text` string, or type `image`")
        for frame in frames:
            yield frame


class Embed:
    async def setup(self, ctx) -> None:
        MultimodalRuntime.shared()

    def encode(self, ctx, text_seg):  # plain: runs on the replica's thread, beside the other encoders
        runtime = MultimodalRuntime.shared()
        ids = runtime.tokenizer.encode(text_seg["text"]) or [runtime.tokenizer.pad_id]
        return {"txt_emb": {"tokens": ids, "hidden": runtime.embedder.embed(ids)}}


class Vit:
    async def setup(self, ctx) -> None:
        MultimodalRuntime.shared()

    async def encode(self, ctx, image_seg):
        from flowstd.models import tensor_content_hash

        runtime = MultimodalRuntime.shared()
        pixels = image_seg.pixels()
        content = tensor_content_hash(pixels)
        cached = content in runtime.vit_cache
        # the forward on a worker thread (torch releases the GIL): the VAE encodes beside it
        rows = await runtime.vit_cache.get(content, lambda: asyncio.to_thread(runtime.vit.encode, pixels))
        return {"vit_emb": {"content": content, "hidden": rows, "cached": cached}}


class Vae:
    async def setup(self, ctx) -> None:
        MultimodalRuntime.shared()

    # plain methods: they run on the replica's thread, so the VAE and the ViT encode an image at
    # the same time (torch releases the GIL), and the loop stays free for the other roles
    def encode(self, ctx, image_seg):
        return {"vae_lat": MultimodalRuntime.shared().vae.encode(image_seg.pixels())}

    def decode(self, ctx, latent):
        return {"image": GeneratedImage(MultimodalRuntime.shared().vae.decode(latent))}


@dataclass
class GeneratedImage:
    """A decoded image (uint8 (H, W, 3)); events show its size and mean brightness, or with
    `media()` the whole image as a PNG."""

    pixels: Any

    def media(self) -> dict:
        from flowrt import media

        height, width, _ = self.pixels.shape
        rgb = self.pixels.detach().to("cpu").contiguous().numpy().tobytes()
        return media.carried("png", media.encode_png(rgb, int(width), int(height)), width=int(width), height=int(height))

    def summary(self) -> dict:
        height, width, _ = self.pixels.shape
        return {
            "image": {"width": int(width), "height": int(height), "mode": "RGB", "mean": round(float(self.pixels.float().mean()))}
        }


def check_global(ctx) -> None:
    """In setup: refuse a `global kv` the LLM's (and so the DiT's) K/V do not fit."""
    check_kv_fits(
        ctx, MultimodalRuntime.shared().spec, page_tokens=PAGE_TOKENS, model="the multimodal LLM (flowstd.roles.multimodal)"
    )


class CallTokens:
    """The tokens each call's earlier activations generated, on this replica (`lb session`: a
    call's segments all run here, one at a time): what makes `usage` count the whole call. The
    latest `limit` calls are kept; a call that ended is never asked again."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._generated: OrderedDict[str, int] = OrderedDict()

    def earlier(self, call_id: str) -> int:
        return self._generated.get(call_id, 0)

    def add(self, call_id: str, generated: int) -> None:
        self._generated[call_id] = self._generated.get(call_id, 0) + generated
        self._generated.move_to_end(call_id)
        while len(self._generated) > self.limit:
            self._generated.popitem(last=False)


class Llm:
    def __init__(self) -> None:
        self.calls = CallTokens()

    async def setup(self, ctx) -> None:
        check_global(ctx)

    async def generate(self, ctx, txt_emb=None, vit_emb=None, vae_lat=None):
        runtime = MultimodalRuntime.shared()
        if txt_emb is not None:
            item = Text(txt_emb["tokens"], hidden=txt_emb["hidden"])
            segment = {"segment": "text", "encoder_cache_hit": None}
        else:
            item = Media("image", content=vit_emb["content"], hidden=vit_emb["hidden"])
            segment = {"segment": "image", "encoder_cache_hit": bool(vit_emb["cached"])}
        async with ctx.kv(GLOBAL) as kv:
            engines = runtime.for_pool(kv)
            plan = await engines.matcher.incremental(kv, [item])
            # each token is sent as it is sampled: the generation runs as a task feeding a queue
            tokens: asyncio.Queue = asyncio.Queue()
            task = asyncio.ensure_future(
                engines.generator.generate(kv, plan, max_new_tokens=NEW_TOKENS, on_token=tokens.put_nowait)
            )
            task.add_done_callback(lambda _: tokens.put_nowait(None))
            # text through the streaming detokenizer: a character split over tokens goes out whole
            detokenizer = runtime.tokenizer.stream_detokenizer(skip_special_tokens=False)
            generated = 0
            try:
                while (token := await tokens.get()) is not None:
                    generated += 1
                    if text := detokenizer.push(token):
                        yield {"token": text}
                result = await task
                if tail := detokenizer.finish():  # the segment's tokens stopped mid-character: U+FFFD, as decode
                    yield {"token": tail}
            finally:
                if not task.done():  # the consumer went away mid-stream: stop generating before the pages go
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
        import torch

        history = engines.matcher.history(ctx.session)
        ran = len(result.context_slots)
        earlier = self.calls.earlier(ctx.call_id)  # generated by this call's earlier segments
        self.calls.add(ctx.call_id, generated)
        yield {
            "usage": {
                **segment,
                # the call so far, as OpenAI counts (/v1's `usage` takes the last): what the LLM
                # read that this call did not generate, and what this call generated
                "prompt_tokens": result.prompt_tokens - earlier,
                "completion_tokens": earlier + generated,
                "reused_tokens": result.reused_tokens,
                "computed_tokens": result.computed_tokens,
                "hit_pages": plan.hit_pages,
            }
        }
        yield {
            "hidden": {
                "last": result.hidden,
                # a copy: a view would carry its whole storage across processes
                "rows": torch.as_tensor(history.rows_between(0, ran)).clone(),
                "keys": list(history.keys[: ran // PAGE_TOKENS]),
            }
        }


class Dit:
    async def setup(self, ctx) -> None:
        check_global(ctx)

    async def denoise(self, ctx, hidden, vit_emb=(), vae_lat=()):
        """A latent attending to the context of the first `hidden` (the LLM's first activation);
        `vit_emb` is only joined (image_chat's topology: the DiT starts once every image is encoded),
        the first of `vae_lat` steers it (an edit)."""
        runtime = MultimodalRuntime.shared()
        hidden = hidden[0] if isinstance(hidden, list) else hidden
        latents = list(vae_lat) if isinstance(vae_lat, (list, tuple)) else [vae_lat]
        condition = latents[0] if latents else None  # an edit: the first image steers the latent
        async with ctx.kv(GLOBAL) as kv:
            engines = runtime.for_pool(kv)
            context = await place_context(kv, engines.engine, hidden["rows"], hidden["keys"], batcher=engines.batcher)
            latent = await engines.sampler.sample(
                context.slots, hidden["last"], size=(IMAGE_SIZE // 8, IMAGE_SIZE // 8), steps=DIT_STEPS, image_condition=condition
            )
        return {"latent": latent}
