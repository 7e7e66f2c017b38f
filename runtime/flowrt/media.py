"""Media codecs: images and audio in and out of the values roles and events carry.

    media_bytes(text, part=, kind=)          a data URL or base64 text -> the encoded file's bytes
    decode_image(data, part=)                PNG, JPEG or WebP -> DecodedImage (RGB8, row-major)
    encode_png(rgb, width, height)           RGB8 -> a PNG file (lossless: it decodes to the same bytes)
    decode_audio(data, sample_rate=, part=)  WAV, FLAC or OGG -> DecodedAudio (mono float32 at that rate)
    resample(samples, source, target)        linear interpolation (below)
    pcm16(samples), encode_wav(pcm, rate)    float samples -> int16 bytes -> a WAV file (PCM16)
    carried(format, data, **fields)          the JSON a value's `media()` gives: {"format", "base64", ...}
    joined_wav(pieces)                       carried PCM16 WAVs (speech chunks) joined into one
    carried_pcm16(piece)                     a carried PCM16 WAV -> (its samples' bytes, its sample rate)
    with_files(value, resolve)               JSON whose `file:NAME` strings become data URLs (a CLI's files, uploads)

**Limits** (`MediaLimits`, read from the environment at each call, or passed as `limits=`):
FLOWRT_MAX_IMAGE_PIXELS (16,777,216: 4096 x 4096), FLOWRT_MAX_MEDIA_BYTES (20 MiB of encoded
file, checked on the base64 text before it is decoded) and FLOWRT_MAX_AUDIO_SECONDS (30). An
image's size is read from its header and checked before a pixel is decoded (Pillow's own
decompression-bomb check, which warns or fails at other sizes, is not used: the plugin reads the
header, this module decides); audio is read at most to the limit, whatever its header says.

**Errors**: bad media raise `MediaError` (a `BadInput`: the caller's to fix), its message starting
with the part of the request it names (`image 2: a 20000x20000 PNG is 400,000,000 pixels; the
limit is 16,777,216 (FLOWRT_MAX_IMAGE_PIXELS)`). Without the `media` extra (Pillow, soundfile),
a codec raises `MediaUnavailable`, naming `pip install 'flowc[media]'`.

**Conventions**: float samples are int16 / 32768 (libsndfile's), and `pcm16` inverts that
exactly, so a PCM16 WAV decoded and re-encoded gives its own bytes. `resample` interpolates
linearly between neighbouring samples, with no anti-aliasing filter: deterministic and cheap,
right for speech into the tiny encoders here; resample with a proper filter before sending
audio where its quality matters. Several channels are averaged to one.

Imports neither torch nor the compiler; Pillow, soundfile and numpy are imported on first use,
so importing this module needs none of them.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import io
import os
import re
import struct
import wave
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from flowrt.errors import BadInput, FlowrtError

EXTRA = "pip install 'flowc[media]' (flowc[models] includes it)"
IMAGE_FORMATS = ("PNG", "JPEG", "WebP")  # what decode_image reads
AUDIO_FORMATS = ("WAV", "FLAC", "OGG")  # what decode_audio reads
PLUGINS = {  # format -> Pillow's plugin module and the class that opens it (what Image.open would pick)
    "PNG": ("PIL.PngImagePlugin", "PngImageFile"),
    "JPEG": ("PIL.JpegImagePlugin", "JpegImageFile"),
    "WebP": ("PIL.WebPImagePlugin", "WebPImageFile"),
}
UNKNOWN_LENGTH = 0xFFFFFFFF  # a WAV data chunk's size when the writer streamed it (to the end of the file)


class MediaError(BadInput):
    """Media a role cannot read: corrupt, of a format it does not take, or over a limit. The
    message starts with the part of the request and names the limit or the fix."""


class MediaUnavailable(FlowrtError):
    """A codec library is not installed: the message names the extra to install."""


# ── limits ──


@dataclass(frozen=True)
class MediaLimits:
    """What a request may carry; `from_environment()` reads the three variables (module docstring)."""

    max_image_pixels: int = 4096 * 4096
    max_media_bytes: int = 20 * 1024 * 1024
    max_audio_seconds: float = 30.0

    VARIABLES: ClassVar[dict[str, str]] = {
        "max_image_pixels": "FLOWRT_MAX_IMAGE_PIXELS",
        "max_media_bytes": "FLOWRT_MAX_MEDIA_BYTES",
        "max_audio_seconds": "FLOWRT_MAX_AUDIO_SECONDS",
    }

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> MediaLimits:
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field, variable in cls.VARIABLES.items():
            text = environ.get(variable, "").strip()
            if not text:
                continue
            kind = float if field == "max_audio_seconds" else int
            try:
                value = kind(text.replace("_", ""))
            except ValueError:
                value = None
            if value is None or not value > 0 or value == float("inf"):
                example = getattr(cls, field)
                raise FlowrtError(f"{variable} is {text!r}; give a number above 0, e.g. {example:g} (the default)")
            values[field] = value
        return cls(**values)

    def name(self, field: str) -> str:
        return self.VARIABLES[field]


def media_limits() -> MediaLimits:
    """The limits in force now (the environment's, else the defaults)."""
    return MediaLimits.from_environment()


def _check_bytes(size: int, part: str, kind: str, limits: MediaLimits) -> None:
    if size > limits.max_media_bytes:
        raise MediaError(
            f"{part}: the {kind} is {size:,} bytes; the limit is {limits.max_media_bytes:,} ({limits.name('max_media_bytes')})"
        )


# ── the encoded file ──


def media_bytes(text: Any, *, part: str, kind: str = "image", limits: MediaLimits | None = None) -> bytes:
    """The bytes of a file given as a data URL (`data:image/png;base64,...`) or as base64 text.
    Remote URLs are refused: nothing is fetched."""
    limits = limits or media_limits()
    if not isinstance(text, str):
        raise MediaError(f"{part}: the {kind} is a data URL or base64 text, not {_kind(text)}")
    text = text.strip()
    head = text[:16].lower()
    if head.startswith("data:"):
        header, comma, text = text.partition(",")
        if not comma or not header.lower().endswith(";base64"):
            raise MediaError(f"{part}: a data URL must hold base64 (data:{_example(kind)};base64,...), not {header[:40]!r}")
    elif "://" in head:
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise MediaError(
            f"{part}: {shown} is a remote URL, and the server fetches nothing; send the {kind} inline, "
            f"as a data URL (data:{_example(kind)};base64,...) or base64"
        )
    if any(space in text for space in "\n\r\t "):
        text = "".join(text.split())  # MIME-style base64 broken into lines
    _check_bytes(len(text) * 3 // 4, part, kind, limits)  # before decoding
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError(f"{part}: the {kind} is not valid base64") from None


def _example(kind: str) -> str:
    return "audio/wav" if kind == "audio" else "image/png"


def sniff(data: bytes) -> str | None:
    """The file format its first bytes show, or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data[:4] == b"RIFF" and data[8:12] in (b"WEBP", b"WAVE"):
        return "WebP" if data[8:12] == b"WEBP" else "WAV"
    for magic, name in (
        (b"GIF8", "GIF"),
        (b"BM", "BMP"),
        (b"II*\x00", "TIFF"),
        (b"MM\x00*", "TIFF"),
        (b"fLaC", "FLAC"),
        (b"OggS", "OGG"),
        (b"ID3", "MP3"),
    ):
        if data.startswith(magic):
            return name
    if data[4:8] == b"ftyp":
        return "MP4/HEIF/AVIF"
    return None


def _format(data: bytes, part: str, kind: str, accepted: tuple[str, ...]) -> str:
    """The format of `data`, one of `accepted`; else a MediaError naming what it is."""
    found = sniff(data)
    if found in accepted:
        return found
    if found is not None:
        told = f"a {found} file"
    elif not data:
        told = "empty"
    else:
        told = f"not an {kind} file this server reads (it starts {data[:8].hex()})"
    raise MediaError(f"{part}: {told}; give {', '.join(accepted[:-1])} or {accepted[-1]}")


# ── images ──


@dataclass(frozen=True)
class DecodedImage:
    width: int
    height: int
    rgb: bytes  # height rows of width (r, g, b) bytes
    format: str  # what the file was: PNG, JPEG or WebP


def decode_image(data: bytes, *, part: str = "the image", limits: MediaLimits | None = None) -> DecodedImage:
    """A PNG, JPEG or WebP file as RGB8 (alpha dropped, palettes expanded, EXIF rotation applied,
    an animation's first frame); its size is checked from the header before decoding."""
    limits = limits or media_limits()
    _check_bytes(len(data), part, "image", limits)
    found = _format(data, part, "image", IMAGE_FORMATS)
    image_module, ops, opener = _pillow(found)
    try:
        picture = opener(io.BytesIO(data))  # the plugin reads the header only
    except image_module.DecompressionBombError as error:  # WebP's plugin checks too, at twice Pillow's limit
        size = re.search(r"\((\d+) pixels\)", str(error))
        told = f"of {int(size.group(1)):,} pixels" if size else "over Pillow's limit"
        raise MediaError(
            f"{part}: a {found} {told}; the limit is {limits.max_image_pixels:,} ({limits.name('max_image_pixels')})"
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError, struct.error) as error:
        raise MediaError(f"{part}: a corrupt {found} ({error})") from None
    with picture:
        width, height = picture.size
        if width * height > limits.max_image_pixels:
            raise MediaError(
                f"{part}: a {width}x{height} {found} is {width * height:,} pixels; the limit is "
                f"{limits.max_image_pixels:,} ({limits.name('max_image_pixels')})"
            )
        try:
            picture.load()
            upright = ops.exif_transpose(picture)
            if upright.mode.startswith("I;16"):  # 16-bit grey: the high byte (Pillow's RGB would clip)
                upright = upright.convert("I").point(lambda value: value * (1 / 256)).convert("L")
            rgb = upright.convert("RGB")
        except (
            OSError,
            SyntaxError,
            ValueError,
            EOFError,
            struct.error,
            zlib.error,
            image_module.DecompressionBombError,
        ) as error:
            raise MediaError(f"{part}: the {found} is corrupt or truncated ({error})") from None
    return DecodedImage(rgb.width, rgb.height, rgb.tobytes(), found)


def encode_png(rgb: bytes, width: int, height: int) -> bytes:
    """RGB8 pixels (height rows of width) as a PNG file."""
    if len(rgb) != width * height * 3:
        raise ValueError(f"a {width}x{height} RGB image is {width * height * 3} bytes, not {len(rgb)}")
    image = _require("PIL.Image", "Pillow", "encoding a PNG")
    out = io.BytesIO()
    image.frombytes("RGB", (width, height), bytes(rgb)).save(out, format="PNG")
    return out.getvalue()


def _pillow(found: str) -> tuple[Any, Any, Any]:
    """Pillow's Image and ImageOps modules and the plugin class that opens `found`."""
    image = _require("PIL.Image", "Pillow", f"decoding a {found}")
    ops = importlib.import_module("PIL.ImageOps")
    if found == "WebP":
        features = importlib.import_module("PIL.features")
        if not features.check("webp"):
            raise MediaUnavailable("decoding a WebP needs a Pillow built with WebP (Pillow's wheels are): " + EXTRA)
    module, opener = PLUGINS[found]
    return image, ops, getattr(importlib.import_module(module), opener)


# ── audio ──


@dataclass(frozen=True)
class DecodedAudio:
    samples: Any  # numpy float32 (n,): mono, int16 / 32768 scale
    sample_rate: int  # the rate asked for
    format: str  # what the file was: WAV, FLAC or OGG
    source_rate: int  # the file's rate before resampling
    channels: int  # the file's channels before mixing


def decode_audio(data: bytes, *, sample_rate: int, part: str = "the audio", limits: MediaLimits | None = None) -> DecodedAudio:
    """A WAV, FLAC or OGG file as mono float32 samples at `sample_rate` (channels averaged,
    resampled by `resample`); at most the duration limit is read."""
    limits = limits or media_limits()
    _check_bytes(len(data), part, "audio", limits)
    found = _format(data, part, "audio", AUDIO_FORMATS)
    if found == "WAV":
        _check_riff(data, part)
    soundfile = _require("soundfile", "soundfile", f"decoding {found} audio")
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as file:
            rate, channels, frames = file.samplerate, file.channels, file.frames
            most = int(limits.max_audio_seconds * rate)
            # a header saying too many is refused unread; one saying too few, by reading one past the limit
            block = file.read(frames=most + 1, dtype="float32", always_2d=True) if frames <= most else None
    except (RuntimeError, ValueError, TypeError, soundfile.SoundFileError) as error:
        raise MediaError(f"{part}: a corrupt {found} ({error})") from None
    if block is None or len(block) > most:
        told = (
            f"{frames / rate:.1f} s ({frames:,} samples at {rate} Hz)" if block is None else "more samples than its header says"
        )
        raise MediaError(
            f"{part}: a {found} of {told}; the limit is {limits.max_audio_seconds:g} s ({limits.name('max_audio_seconds')})"
        )
    mono = block.mean(axis=1, dtype="float32") if channels > 1 else block[:, 0]
    return DecodedAudio(resample(mono, rate, sample_rate), sample_rate, found, rate, channels)


def _check_riff(data: bytes, part: str) -> None:
    """A WAV's data chunk must hold what its header says (libsndfile would read a short file
    quietly): a header that says more than the file has is refused."""
    offset = 12
    while offset + 8 <= len(data):
        chunk, size = data[offset : offset + 4], int.from_bytes(data[offset + 4 : offset + 8], "little")
        present = len(data) - offset - 8
        if chunk == b"data":
            if size > present and size != UNKNOWN_LENGTH:
                raise MediaError(
                    f"{part}: the WAV's header says its samples are {size:,} bytes, but the file holds {present:,} "
                    "(truncated, or the header is wrong)"
                )
            return
        if size > present:
            break
        offset += 8 + size + (size & 1)
    raise MediaError(f"{part}: a corrupt WAV (no data chunk where its header says)")


def resample(samples: Any, source: int, target: int) -> Any:
    """`samples` (float, at `source` Hz) at `target` Hz by linear interpolation: output sample i is
    read at input position i * source / target; round(n * target / source) samples come out."""
    numpy = _require("numpy", "numpy", "resampling audio")
    samples = numpy.asarray(samples, dtype=numpy.float32)
    if source == target or not len(samples):
        return samples
    if source <= 0 or target <= 0:
        raise ValueError(f"sample rates are above 0, not {source} and {target}")
    count = max(1, round(len(samples) * target / source))
    positions = numpy.arange(count, dtype=numpy.float64) * (source / target)
    return numpy.interp(positions, numpy.arange(len(samples), dtype=numpy.float64), samples).astype(numpy.float32)


def pcm16(samples: Any) -> bytes:
    """Float samples (int16 / 32768 scale) as little-endian int16 bytes: x * 32768, rounded, clipped."""
    numpy = _require("numpy", "numpy", "encoding PCM16")
    scaled = numpy.round(numpy.asarray(samples, dtype=numpy.float64) * 32768.0)
    return numpy.clip(scaled, -32768, 32767).astype("<i2").tobytes()


def encode_wav(pcm: bytes, sample_rate: int, channels: int = 1) -> bytes:
    """Little-endian int16 samples as a PCM16 WAV file (the standard library writes it)."""
    if len(pcm) % (2 * channels):
        raise ValueError(f"PCM16 of {channels} channel(s) is whole frames of {2 * channels} bytes; got {len(pcm)} bytes")
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(channels)
        file.setsampwidth(2)
        file.setframerate(sample_rate)
        file.writeframes(pcm)
    return out.getvalue()


# ── out ──


def carried(format: str, data: bytes, **fields: Any) -> dict[str, Any]:
    """A media value in full, as events carry it (`summarize(value, media=True)`)."""
    return {"format": format, "base64": base64.b64encode(data).decode("ascii"), **fields}


def joined_wav(pieces: list[dict[str, Any]]) -> dict[str, Any]:
    """One carried WAV of carried PCM16 WAV pieces in order (a reply's speech chunks, for an answer
    that holds the whole audio); the standard library reads and writes them."""
    if not pieces:
        raise ValueError("no audio to join")
    frames, rate = [], None
    for index, piece in enumerate(pieces):
        pcm, piece_rate = carried_pcm16(piece, f"piece {index}")
        if rate not in (None, piece_rate):
            raise ValueError(f"piece {index} is at {piece_rate} Hz, the others at {rate} Hz")
        rate = piece_rate
        frames.append(pcm)
    pcm = b"".join(frames)
    return carried("wav", encode_wav(pcm, rate), sample_rate=rate, samples=len(pcm) // 2)


def carried_pcm16(piece: Any, name: str = "the audio") -> tuple[bytes, int]:
    """A carried mono PCM16 WAV's samples (little-endian int16 bytes) and its sample rate;
    ValueError naming `name` for anything else."""
    if not isinstance(piece, Mapping) or piece.get("format") != "wav" or not isinstance(piece.get("base64"), str):
        shown = piece.get("format") if isinstance(piece, Mapping) else type(piece).__name__
        raise ValueError(f"{name} is {shown!r}, not a carried wav")
    try:
        with wave.open(io.BytesIO(base64.b64decode(piece["base64"]))) as file:
            if (file.getnchannels(), file.getsampwidth()) != (1, 2):
                raise ValueError(f"{name} is not mono PCM16")
            return file.readframes(file.getnframes()), file.getframerate()
    except (wave.Error, EOFError, binascii.Error) as error:
        raise ValueError(f"{name} is not a readable WAV ({error})") from None


# ── files named in a request ──

FILE_PREFIX = "file:"


def with_files(value: Any, resolve: Callable[[str], tuple[bytes, str]]) -> Any:
    """`value` (JSON) with each string `file:NAME` replaced by a `data:` URL of `resolve(NAME)`,
    (the bytes, their MIME type), which the media readers take wherever they take base64: how
    `flowc run --input` sends a local file and a multipart request an uploaded part. `resolve`
    raises to refuse a name. Walked without recursion; `value` is changed in place."""
    todo = [value] if isinstance(value, (dict, list)) else []
    while todo:
        node = todo.pop()
        for key, item in list(node.items() if isinstance(node, dict) else enumerate(node)):
            if isinstance(item, (dict, list)):
                todo.append(item)
            elif isinstance(item, str) and item.startswith(FILE_PREFIX):
                data, mime = resolve(item[len(FILE_PREFIX) :])
                node[key] = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
    return value


def _require(module: str, package: str, purpose: str) -> Any:
    try:
        return importlib.import_module(module)
    except (ImportError, OSError) as error:  # soundfile raises OSError when libsndfile is missing
        raise MediaUnavailable(f"{purpose} needs {package}, which is not installed ({error}): {EXTRA}") from None


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
