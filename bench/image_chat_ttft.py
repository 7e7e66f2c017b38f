"""Time to first token and to the image of examples/image_chat_models: the pipelined graph under
`--deploy inproc` and `local` vs a sequential implementation of the same models, side by side.

A request holds a text segment and `--images` images (16x16 random pixels, new ones every
repetition, so no encoder cache hits; a new session every repetition, so no KV reuse):

- **inproc**, **local**, **local shards** (`FLOWRT_CONTROL=shards`): `graph chat` of the example on a deployment; the clock runs from the call
  to the first `token` event and to the `image` return. Each segment is its own LLM activation:
  the text's tokens can stream while the images are still being encoded (pipelined segments),
  and the DiT starts once the first `hidden` and every image condition are in.
- **sequential**: the same models called one after another in this process, no runtime: parse,
  embed the text, encode every image (ViT, VAE), one LLM prefill of the whole prompt from a
  `PrefixMatcher` plan and its tokens, the DiT on that context, the VAE decode.

Both do the same work per request (the pipeline runs the LLM once per segment, each time
generating 4 tokens; the sequential run generates 4 tokens after the whole prompt). Median of the
repetitions after one warm-up call; ratios are sequential / pipelined.

    .venv/bin/python bench/image_chat_ttft.py [--images 3] [--repeat 7] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "stdlib"))

import torch  # noqa: E402

from flowc.check import check_source  # noqa: E402
from flowc.codegen import build_bundle  # noqa: E402
from flowrt.compute.engine.planned import place_context  # noqa: E402
from flowrt.compute.hashing import page_hashes  # noqa: E402
from flowrt.compute.prefix import Media, Text  # noqa: E402
from flowrt.deploy import open_deployment  # noqa: E402
from flowrt.params.meta import EmbeddedStore  # noqa: E402
from flowrt.params.pool import KVPool  # noqa: E402
from flowrt.params.session import KVSession  # noqa: E402
from flowstd.models import tensor_content_hash  # noqa: E402
from flowstd.roles import multimodal  # noqa: E402

EXAMPLE = ROOT / "examples" / "image_chat_models" / "pipeline.flow"


def request(images: int, seed: int) -> dict:
    rng = random.Random(seed)
    segments = [{"type": "text", "text": f"describe these pictures, take {seed}"}]
    for _ in range(images):
        segments.append(
            {"type": "image", "pixels": [[[rng.randrange(256) for _ in range(3)] for _ in range(16)] for _ in range(16)]}
        )
    return {"request": {"segments": segments}}


async def pipelined(bundle: Path, deploy: str, requests: list[dict], control: str = "gateway") -> list[tuple[float, float]]:
    from flowrt.deploy.local import CONTROL_ENV

    os.environ[CONTROL_ENV] = control  # (read as the deployment opens)
    deployment = await open_deployment(bundle, deploy)
    try:
        times = []
        for index, inputs in enumerate(requests):
            started = time.perf_counter()
            first = image = None
            async for event in deployment.runtime.call("chat", inputs, session=f"{deploy}-{index}", timeout=60):
                now = time.perf_counter() - started
                if event.get("field") == "token" and first is None:
                    first = now
                if event.get("field") == "image":
                    image = now
                if event["event"] == "done" and event["status"] != "ok":
                    raise RuntimeError(f"{deploy}: the call failed: {event}")
            times.append((first, image))
        return times
    finally:
        await deployment.close()


async def sequential(requests: list[dict]) -> list[tuple[float, float]]:
    runtime = multimodal.MultimodalRuntime.shared()
    layout = runtime.spec.kv_layout("kv", multimodal.PAGE_TOKENS)
    pool = KVPool(layout, device_pages=256, store=EmbeddedStore("seq"), deployment="seq", node="seq")
    try:
        times = []
        for index, inputs in enumerate(requests):
            started = time.perf_counter()
            items, conditions = [], []
            for segment in inputs["request"]["segments"]:
                if segment["type"] == "text":
                    ids = runtime.tokenizer.encode(segment["text"])
                    items.append(Text(ids, hidden=runtime.embedder.embed(ids)))
                else:
                    pixels = multimodal.image_payload(segment).pixels()
                    items.append(Media("image", content=tensor_content_hash(pixels), hidden=runtime.vit.encode(pixels)))
                    conditions.append(runtime.vae.encode(pixels))
            async with KVSession(pool, f"seq-{index}", f"call-{index}", page_hashes) as kv:
                engines = runtime.for_pool(kv)
                plan = await engines.matcher.incremental(kv, items)
                first: list[float] = []

                def on_token(_token: int, first: list[float] = first, started: float = started) -> None:
                    if not first:
                        first.append(time.perf_counter() - started)

                result = await engines.generator.generate(kv, plan, max_new_tokens=multimodal.NEW_TOKENS, on_token=on_token)
                history = engines.matcher.history(kv.session)
                ran = len(result.context_slots)
                keys = list(history.keys[: ran // multimodal.PAGE_TOKENS])
                context = await place_context(kv, engines.engine, history.rows_between(0, ran), keys)
                side = multimodal.IMAGE_SIZE // 8
                latent = await engines.sampler.sample(
                    context.slots,
                    result.hidden,
                    size=(side, side),
                    steps=multimodal.DIT_STEPS,
                    image_condition=conditions[0] if conditions else None,
                )
            runtime.vae.decode(latent)
            times.append((first[0], time.perf_counter() - started))
        return times
    finally:
        pool.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=3, help="images per request (default 3)")
    parser.add_argument("--repeat", type=int, default=7, help="timed calls per mode (default 7)")
    parser.add_argument("--quick", action="store_true", help="1 image, 2 timed calls: a smoke run")
    args = parser.parse_args()
    images, repeat = (1, 2) if args.quick else (args.images, args.repeat)
    torch.set_num_threads(1)  # the replicas of `local` each get a core; the same for every mode
    requests = [request(images, seed) for seed in range(repeat + 1)]

    with tempfile.TemporaryDirectory() as directory:
        result = check_source(EXAMPLE.read_text(), "pipeline.flow", EXAMPLE)
        if not result.ok:
            raise SystemExit(f"{EXAMPLE}: {[d.message for d in result.diagnostics]}")
        bundle = Path(directory) / "bundle"
        build_bundle(result.program, EXAMPLE, bundle).write(bundle)
        runs = {
            "sequential": asyncio.run(sequential(requests)),
            "inproc": asyncio.run(pipelined(bundle, "inproc", requests)),
            "local": asyncio.run(pipelined(bundle, "local", requests)),
            "local shards": asyncio.run(pipelined(bundle, "local", requests, "shards")),
        }

    print(f"image_chat_models: 1 text segment + {images} image(s) of 16x16, {repeat} timed calls after a warm-up")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, 1 torch thread")
    medians = {}
    for mode, times in runs.items():
        timed = times[1:]  # the first call warms the models and the deployment up
        medians[mode] = (statistics.median(t[0] for t in timed), statistics.median(t[1] for t in timed))
        print(f"{mode:>10}: first token {medians[mode][0] * 1e3:7.1f} ms   image {medians[mode][1] * 1e3:7.1f} ms (median)")
    for mode in ("inproc", "local", "local shards"):
        token = medians["sequential"][0] / medians[mode][0]
        image = medians["sequential"][1] / medians[mode][1]
        print(f"sequential / {mode}: first token x{token:.2f}, image x{image:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
