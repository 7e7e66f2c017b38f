"""`POST /graphs/GRAPH` carries images and audio in full (issue 33): a real `flowc run --http`
server whose roles return flowstd's own media values (the multimodal frontend's `ImagePayload`,
the talker's `SpeechChunk`); each NDJSON line holds a base64 PNG or WAV with its `format`, which
Pillow and soundfile decode to exactly the role's pixels and samples. `?summary=1` asks for the
summaries, which are exactly what `flowc run --once` prints (its default stays summaries)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest

from tests.conftest import HAVE_MODELS, NO_MODELS
from tests.deploy.helpers import bundle_with_roles
from tests.runtime.test_serve import flowc, lines, serving

pytestmark = pytest.mark.skipif(not HAVE_MODELS, reason=NO_MODELS)

FLOW = """
flow media_out

placeholder request: Json

role painter {
    impl "media_out_roles:Painter"
    interface paint { in request  out picture: Image }
}

role speaker {
    impl "media_out_roles:Speaker"
    interface speak { in request  out stream speech: Audio }
}

graph show {
    entry  request
    return picture
    stream speech ordered
}
"""

ROLES = """
from array import array

from flowstd.roles.multimodal import ImagePayload
from flowstd.roles.voice import SpeechChunk


class Painter:
    async def paint(self, ctx, request):
        return {"picture": ImagePayload(request["width"], request["height"], bytes(request["rgb"]))}


class Speaker:
    async def speak(self, ctx, request):
        offset = 0
        for index, samples in enumerate(request["chunks"]):
            pcm = array("h", samples)
            yield {"speech": SpeechChunk(index, offset, pcm.tobytes())}  # (little-endian, as the talker's)
            offset += len(samples)
"""

WIDTH, HEIGHT = 7, 5
RGB = [(x * 37 + y * 11 + channel * 101) % 256 for y in range(HEIGHT) for x in range(WIDTH) for channel in range(3)]
CHUNKS = [[0, 1, -1, 32767, -32768, 1234, -4321], [5, -5, 16000, -16000], [7]]
REQUEST = {"request": {"width": WIDTH, "height": HEIGHT, "rgb": RGB, "chunks": CHUNKS}}


@pytest.fixture(scope="module")
def media_bundle(tmp_path_factory) -> Path:
    return bundle_with_roles(FLOW, ROLES, tmp_path_factory.mktemp("media_out"), module="media_out_roles")


def _events(server, query: str = "") -> tuple[int, list[dict]]:
    response = server.post(f"/graphs/show{query}", json.dumps(REQUEST).encode())
    assert response.getheader("Content-Type", "").startswith("application/x-ndjson"), response.getheader("Content-Type")
    return response.status, lines(response)


def test_graph_events_carry_png_and_wav_that_decode_to_the_roles_pixels_and_samples(media_bundle):
    import numpy
    import soundfile
    from PIL import Image

    with serving(media_bundle) as server:
        status, events = _events(server)
        assert status == 200 and events[-1] == {"event": "done", "status": "ok", "errors": [], "missing": []}, events[-1]
        (picture,) = [e["value"] for e in events if e.get("field") == "picture"]
        assert picture["format"] == "png" and (picture["width"], picture["height"]) == (WIDTH, HEIGHT)
        image = Image.open(io.BytesIO(base64.b64decode(picture["base64"])))
        assert image.format == "PNG" and image.mode == "RGB" and image.size == (WIDTH, HEIGHT)
        assert list(image.tobytes()) == RGB  # exactly the role's pixels

        speech = [e["value"] for e in events if e.get("field") == "speech"]
        assert [chunk["chunk"] for chunk in speech] == [0, 1, 2]  # an ordered stream, in order
        assert [chunk["offset"] for chunk in speech] == [0, 7, 11]
        for chunk, want in zip(speech, CHUNKS, strict=True):
            assert chunk["format"] == "wav" and chunk["samples"] == len(want) and chunk["sample_rate"] == 16000
            samples, rate = soundfile.read(io.BytesIO(base64.b64decode(chunk["base64"])), dtype="int16")
            assert rate == 16000 and samples.dtype == numpy.int16
            assert samples.tolist() == want  # exactly the role's samples, the extremes included

        status, summarized = _events(server, "?summary=1")
        assert status == 200 and summarized[-1]["status"] == "ok"
        (picture,) = [e["value"] for e in summarized if e.get("field") == "picture"]
        assert picture == {"image": {"width": WIDTH, "height": HEIGHT, "mode": "RGB"}}
        speech = [e["value"] for e in summarized if e.get("field") == "speech"]
        assert [chunk["audio"]["samples"] for chunk in speech] == [7, 4, 1] and all("base64" not in c["audio"] for c in speech)

        refused = server.post("/graphs/show?summary=maybe", json.dumps(REQUEST).encode())
        told = json.loads(refused.read())
        assert refused.status == 400 and "`summary`" in told["error"] and "?summary=1" in told["hint"], told
        assert _events(server, "?summary=0")[1] == events  # 0: in full, as without the parameter

    # `flowc run --once` prints summaries, exactly the lines the server sends with ?summary=1
    once = flowc("run", str(media_bundle), "--once", "show", "--input", json.dumps(REQUEST))
    assert once.returncode == 0, once.stderr
    printed = [json.loads(line) for line in once.stdout.splitlines()]
    assert sorted(map(json.dumps, printed)) == sorted(map(json.dumps, summarized))
    assert "base64" not in once.stdout
