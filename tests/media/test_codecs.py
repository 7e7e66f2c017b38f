"""flowrt.media on real bytes made here with Pillow, soundfile and the standard library's `wave`:
every format decodes, PNG and PCM16 WAV round-trip exactly, corrupt or oversized media are
refused naming the part and the limit, the limits come from the environment, and without the
`media` extra the codecs name it. Also `summarize(..., media=True)`, which carries media values
in full while summaries stay the default."""

from __future__ import annotations

import base64
import io
import json
import re
import struct
import subprocess
import sys
import wave
import zlib

import pytest

Image = pytest.importorskip("PIL.Image", reason="the media codecs need Pillow: pip install 'flowc[media]'")
soundfile = pytest.importorskip("soundfile", reason="the media codecs need soundfile: pip install 'flowc[media]'")

import numpy  # noqa: E402  (soundfile brings it)

from flowrt import media  # noqa: E402
from flowrt.errors import BadInput, FlowrtError  # noqa: E402
from flowrt.values import event_json, summarize  # noqa: E402

RNG = numpy.random.default_rng(7)
PIXELS = RNG.integers(0, 256, (12, 20, 3), dtype=numpy.uint8)  # height 12, width 20
TONE = (numpy.sin(numpy.arange(8000) / 7.0) * 12000).astype("<i2")  # 0.5 s at 16 kHz


def encoded(pixels=PIXELS, format="PNG", **options) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=format, **options)
    return out.getvalue()


def sound(samples=TONE, rate=16000, format="WAV", **options) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format=format, **options)
    return out.getvalue()


def lying_png(width: int, height: int) -> bytes:
    """A small real PNG whose IHDR (CRC fixed up) says another size: a decompression bomb's header."""
    data = bytearray(encoded())
    struct.pack_into(">II", data, 16, width, height)
    struct.pack_into(">I", data, 29, zlib.crc32(bytes(data[12:29])))
    return bytes(data)


# ── images ──


@pytest.mark.parametrize("format", ["PNG", "WEBP"])
def test_lossless_images_decode_to_their_pixels(format):
    options = {"lossless": True} if format == "WEBP" else {}
    image = media.decode_image(encoded(format=format, **options), part="image 0")
    assert (image.width, image.height, image.format) == (20, 12, {"PNG": "PNG", "WEBP": "WebP"}[format])
    assert image.rgb == PIXELS.tobytes()


def test_a_jpeg_decodes_to_what_pillow_decodes():
    data = encoded(format="JPEG", quality=90)
    image = media.decode_image(data, part="image 0")
    assert (image.width, image.height, image.format) == (20, 12, "JPEG")
    assert image.rgb == Image.open(io.BytesIO(data)).convert("RGB").tobytes()


def test_palettes_grey_and_alpha_become_rgb():
    grey = numpy.full((4, 4), 77, dtype=numpy.uint8)
    assert media.decode_image(encoded(grey), part="image 0").rgb == bytes([77]) * 48
    deep = numpy.arange(16, dtype=numpy.uint16).reshape(4, 4) * 4000  # 16-bit grey: its high byte
    assert media.decode_image(encoded(deep), part="image 0").rgb == bytes(v >> 8 for v in deep.flatten() for _ in range(3))
    rgba = numpy.dstack([PIXELS, numpy.full((12, 20), 128, dtype=numpy.uint8)])
    assert media.decode_image(encoded(rgba), part="image 0").rgb == PIXELS.tobytes()  # alpha dropped
    palette = Image.fromarray(PIXELS).quantize(colors=8)
    out = io.BytesIO()
    palette.save(out, format="PNG")
    assert media.decode_image(out.getvalue(), part="image 0").rgb == palette.convert("RGB").tobytes()


def test_png_encoding_is_lossless():
    data = media.encode_png(PIXELS.tobytes(), 20, 12)
    assert data.startswith(b"\x89PNG") and numpy.array_equal(numpy.asarray(Image.open(io.BytesIO(data))), PIXELS)
    with pytest.raises(ValueError, match="a 20x12 RGB image is 720 bytes, not 3"):
        media.encode_png(b"abc", 20, 12)


def test_data_urls_and_base64_give_the_file():
    data = encoded()
    text = base64.b64encode(data).decode()
    assert media.media_bytes(f"data:image/png;base64,{text}", part="p") == data
    assert media.media_bytes(text, part="p") == data
    assert media.media_bytes("\n".join(text[i : i + 76] for i in range(0, len(text), 76)), part="p") == data  # MIME lines


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("https://example.com/cat.png", "image 2: https://example.com/cat.png is a remote URL, and the server fetches nothing"),
        ("http://example.com/cat.png", "send the image inline, as a data URL (data:image/png;base64,...) or base64"),
        ("data:image/png,rawbytes", "image 2: a data URL must hold base64"),
        ("not base64 at all!", "image 2: the image is not valid base64"),
        (None, "image 2: the image is a data URL or base64 text, not null"),
    ],
)
def test_what_is_not_an_inline_file_is_refused(text, words):
    with pytest.raises(media.MediaError) as raised:
        media.media_bytes(text, part="image 2")
    assert words in str(raised.value)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (encoded()[: len(encoded()) // 2], "image 2: the PNG is corrupt or truncated (image file is truncated"),
        (encoded()[:40], "image 2: a corrupt PNG"),
        (
            lying_png(20000, 20000),
            "image 2: a 20000x20000 PNG is 400,000,000 pixels; the limit is 16,777,216 (FLOWRT_MAX_IMAGE_PIXELS)",
        ),
        (encoded(format="GIF"), "image 2: a GIF file; give PNG, JPEG or WebP"),
        (encoded(format="BMP"), "image 2: a BMP file; give PNG, JPEG or WebP"),
        (b"<html>", "image 2: not an image file this server reads (it starts 3c68746d6c3e); give PNG, JPEG or WebP"),
        (b"", "image 2: empty; give PNG, JPEG or WebP"),
    ],
)
def test_corrupt_or_unaccepted_images_are_refused_naming_the_part(data, words):
    with pytest.raises(media.MediaError) as raised:
        media.decode_image(data, part="image 2")
    assert words in str(raised.value)
    assert isinstance(raised.value, BadInput)  # the caller's to fix: HTTP 400


def test_a_webp_bomb_is_refused_by_its_header():
    canvas = b"VP8X" + struct.pack("<I", 10) + bytes(4) + (15999).to_bytes(3, "little") + (15999).to_bytes(3, "little")
    data = b"RIFF" + struct.pack("<I", 4 + len(canvas)) + b"WEBP" + canvas  # 16000 x 16000, and nothing more
    told = "image 3: a WebP of 256,000,000 pixels; the limit is 16,777,216 (FLOWRT_MAX_IMAGE_PIXELS)"
    with pytest.raises(media.MediaError, match=re.escape(told)):
        media.decode_image(data, part="image 3")


def test_the_image_limits_come_from_the_environment(monkeypatch):
    data = encoded()  # 20 x 12 = 240 pixels
    monkeypatch.setenv("FLOWRT_MAX_IMAGE_PIXELS", "239")
    with pytest.raises(media.MediaError, match=r"a 20x12 PNG is 240 pixels; the limit is 239 \(FLOWRT_MAX_IMAGE_PIXELS\)"):
        media.decode_image(data, part="image 0")
    monkeypatch.setenv("FLOWRT_MAX_IMAGE_PIXELS", "240")
    assert media.decode_image(data, part="image 0").width == 20
    with pytest.raises(media.MediaError, match=r"a 2000x2000 PNG is 4,000,000 pixels; the limit is 240 "):
        media.decode_image(lying_png(2000, 2000), part="image 0")
    monkeypatch.setenv("FLOWRT_MAX_IMAGE_PIXELS", "4_000_000")  # a bigger limit lets the header through to the pixels
    with pytest.raises(media.MediaError, match="image 0: the PNG is corrupt or truncated"):
        media.decode_image(lying_png(2000, 2000), part="image 0")
    monkeypatch.setenv("FLOWRT_MAX_MEDIA_BYTES", "100")
    told = f"image 0: the image is {len(data):,} bytes; the limit is 100 (FLOWRT_MAX_MEDIA_BYTES)"
    with pytest.raises(media.MediaError, match=re.escape(told)):
        media.decode_image(data, part="image 0")
    with pytest.raises(media.MediaError, match=r"image 0: the image is \d+ bytes; the limit is 100"):  # before base64 decoding
        media.media_bytes(base64.b64encode(data).decode(), part="image 0")
    limits = media.MediaLimits(max_image_pixels=10)  # or given by the caller, whatever the environment says
    with pytest.raises(media.MediaError, match=r"a 20x12 PNG is 240 pixels; the limit is 10 "):
        media.decode_image(data, part="image 0", limits=limits)


@pytest.mark.parametrize("value", ["0", "-3", "lots", "inf"])
def test_a_bad_limit_names_its_variable(monkeypatch, value):
    monkeypatch.setenv("FLOWRT_MAX_AUDIO_SECONDS", value)
    with pytest.raises(FlowrtError, match=f"FLOWRT_MAX_AUDIO_SECONDS is '{value}'; give a number above 0, e.g. 30"):
        media.media_limits()


# ── audio ──


@pytest.mark.parametrize(("format", "exact"), [("WAV", True), ("FLAC", True), ("OGG", False)])
def test_audio_files_decode_to_mono_floats(format, exact):
    decoded = media.decode_audio(sound(format=format), sample_rate=16000, part="audio 0")
    assert (decoded.format, decoded.sample_rate, decoded.source_rate, decoded.channels) == (format, 16000, 16000, 1)
    assert decoded.samples.dtype == numpy.float32 and decoded.samples.shape == (8000,)
    if exact:  # lossless: the int16 samples, / 32768, and back exactly
        assert media.pcm16(decoded.samples) == TONE.tobytes()
    else:  # Vorbis is lossy
        assert numpy.abs(decoded.samples - TONE / 32768).max() < 0.05


def test_other_rates_are_resampled_and_channels_averaged():
    stereo = numpy.stack([TONE, TONE // 2], axis=1)
    decoded = media.decode_audio(sound(stereo, rate=8000), sample_rate=16000, part="audio 0")
    assert (decoded.source_rate, decoded.channels, decoded.samples.shape) == (8000, 2, (16000,))
    mono = (TONE.astype(numpy.float32) + (TONE // 2)) / 2 / 32768
    assert numpy.allclose(decoded.samples[::2], mono, atol=1e-6)  # even outputs sit on the inputs
    assert numpy.allclose(decoded.samples[1:-1:2], (mono[:-1] + mono[1:]) / 2, atol=1e-6)  # odd ones halfway (linear)
    again = media.decode_audio(sound(stereo, rate=8000), sample_rate=16000, part="audio 0")
    assert again.samples.tobytes() == decoded.samples.tobytes()  # deterministic
    assert media.resample(numpy.ones(441), 44100, 16000).shape == (160,)


def test_pcm16_wav_encoding_is_exact():
    data = media.encode_wav(TONE.tobytes(), 16000)
    samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")
    assert rate == 16000 and samples.tobytes() == TONE.tobytes()
    with wave.open(io.BytesIO(data)) as file:
        assert (file.getnchannels(), file.getsampwidth(), file.getnframes()) == (1, 2, 8000)


def test_carried_wavs_join_into_one():
    pieces = [media.carried("wav", media.encode_wav(part.tobytes(), 16000)) for part in (TONE[:3000], TONE[3000:])]
    whole = media.joined_wav(pieces)
    assert (whole["format"], whole["sample_rate"], whole["samples"]) == ("wav", 16000, 8000)
    assert base64.b64decode(whole["base64"]) == media.encode_wav(TONE.tobytes(), 16000)
    with pytest.raises(ValueError, match="piece 1 is at 8000 Hz, the others at 16000 Hz"):
        media.joined_wav([pieces[0], media.carried("wav", media.encode_wav(TONE.tobytes(), 8000))])
    with pytest.raises(ValueError, match="piece 1 is not mono PCM16"):
        media.joined_wav([pieces[0], media.carried("wav", media.encode_wav(TONE.tobytes(), 16000, channels=2))])
    with pytest.raises(ValueError, match="piece 0 is 'png', not a carried wav"):
        media.joined_wav([media.carried("png", b"x")])
    assert media.carried_pcm16(pieces[1]) == (TONE[3000:].tobytes(), 16000)


def lying_wav(declared: int) -> bytes:
    data = bytearray(sound())
    at = data.index(b"data")
    struct.pack_into("<I", data, at + 4, declared)
    return bytes(data)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (lying_wav(10**6), "audio 1: the WAV's header says its samples are 1,000,000 bytes, but the file holds 16,000"),
        (sound()[:1000], "audio 1: the WAV's header says its samples are 16,000 bytes, but the file holds 956"),
        (sound()[:30], "audio 1: a corrupt WAV (no data chunk where its header says)"),
        (sound(format="FLAC")[:60], "audio 1: a corrupt FLAC"),
        (encoded(), "audio 1: a PNG file; give WAV, FLAC or OGG"),
    ],
)
def test_corrupt_audio_is_refused_naming_the_part(data, words):
    with pytest.raises(media.MediaError) as raised:
        media.decode_audio(data, sample_rate=16000, part="audio 1")
    assert words in str(raised.value)


def test_a_streamed_wav_of_unknown_length_is_read_to_its_end():
    assert len(media.decode_audio(lying_wav(0xFFFFFFFF), sample_rate=16000, part="audio 0").samples) == 8000


def test_the_duration_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("FLOWRT_MAX_AUDIO_SECONDS", "0.25")
    told = r"audio 0: a FLAC of 0.5 s \(8,000 samples at 16000 Hz\); the limit is 0.25 s \(FLOWRT_MAX_AUDIO_SECONDS\)"
    with pytest.raises(media.MediaError, match=told):
        media.decode_audio(sound(format="FLAC"), sample_rate=16000, part="audio 0")
    monkeypatch.setenv("FLOWRT_MAX_AUDIO_SECONDS", "0.5")
    assert len(media.decode_audio(sound(format="FLAC"), sample_rate=16000, part="audio 0").samples) == 8000


# ── the extra, and events ──


def test_importing_the_module_needs_no_codec_and_no_torch():
    code = "import sys, flowrt.media; print(sorted({'PIL', 'soundfile', 'numpy', 'torch', 'flowc'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_without_the_extra_the_codecs_name_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL.Image", None)  # import fails as if Pillow were not installed
    monkeypatch.setitem(sys.modules, "soundfile", None)
    with pytest.raises(media.MediaUnavailable, match=r"decoding a PNG needs Pillow, .*pip install 'flowc\[media\]'"):
        media.decode_image(encoded(), part="image 0")
    with pytest.raises(media.MediaUnavailable, match=r"decoding WAV audio needs soundfile, .*pip install 'flowc\[media\]'"):
        media.decode_audio(sound(), sample_rate=16000, part="audio 0")
    assert not isinstance(media.MediaUnavailable("x"), BadInput)  # the server's to fix: not a client error


class Picture:
    """A role's value with a summary and its media (as flowstd's GeneratedImage)."""

    def summary(self) -> dict:
        return {"image": {"width": 20, "height": 12}}

    def media(self) -> dict:
        return media.carried("png", media.encode_png(PIXELS.tobytes(), 20, 12), width=20, height=12)


def test_events_carry_media_in_full_only_when_asked():
    event = {"field": "image", "value": Picture(), "seq": 3}
    assert json.loads(event_json(event)) == {"field": "image", "value": {"image": {"width": 20, "height": 12}}, "seq": 3}
    carried = json.loads(event_json(event, media=True))["value"]
    assert (carried["format"], carried["width"], carried["height"]) == ("png", 20, 12)
    decoded = Image.open(io.BytesIO(base64.b64decode(carried["base64"])))
    assert numpy.array_equal(numpy.asarray(decoded), PIXELS)
    assert summarize([{"x": Picture()}], media=True)[0]["x"]["format"] == "png"  # inside containers too

    class Broken(Picture):
        def media(self) -> dict:
            raise RuntimeError("no codec")

    assert summarize(Broken(), media=True) == {"object": "Broken", "error": "RuntimeError: no codec"}
