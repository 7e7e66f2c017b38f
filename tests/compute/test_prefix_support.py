"""What the prefix-matching tests share: a real KV pool, deterministic encoders that count their
forwards, and a minimal driver that prefills a plan's frames into the pool the way an engine
would (each page's K/V a function of its positions' hidden states), plus checks of that driver."""

from __future__ import annotations

import asyncio
import functools
import hashlib

import pytest

torch = pytest.importorskip("torch", reason="the KV pool's tiers are torch tensors (the torch extra)")

from flowrt.compute.hashing import page_hashes  # noqa: E402
from flowrt.compute.prefix import PrefillPlan, PrefixMatcher  # noqa: E402
from flowrt.params.layout import KVLayout  # noqa: E402
from flowrt.params.meta import EmbeddedStore  # noqa: E402
from flowrt.params.pool import KVPool  # noqa: E402
from flowrt.params.session import KVSession  # noqa: E402

P = 4  # tokens a page
LAYOUT = KVLayout("kv", ("0", "1"), ("k", "v"), page_tokens=P, heads=2, head_dim=3, dtype="float32")
HIDDEN = 6  # = heads * head_dim: a position's K/V below is its hidden row, reshaped


def sync(test):
    """Run an async test body on a fresh event loop (the pool is single-loop)."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return run


def make_pool(device: int = 32, host: int = 0, node: str = "n1") -> KVPool:
    return KVPool(LAYOUT, device_pages=device, host_pages=host, store=EmbeddedStore("t"), deployment="t", node=node)


class Model:
    """Deterministic stand-ins for a model's embedding table and image encoder, counting calls."""

    def __init__(self) -> None:
        self.embedded: list[list[int]] = []  # token lists embed_tokens was called with
        self.encoded: list[bytes] = []  # payloads the image encoder ran on

    def embed_tokens(self, ids):
        self.embedded.append(list(ids))
        ids = torch.tensor(ids, dtype=torch.float32)
        return torch.sin(ids[:, None] * torch.arange(1, HIDDEN + 1, dtype=torch.float32) / 7)

    async def encode_image(self, payload: bytes):
        self.encoded.append(payload)
        return image_rows(payload)

    def matcher(self, **kwargs) -> PrefixMatcher:
        return PrefixMatcher(embed_tokens=self.embed_tokens, encoders={"image": self.encode_image}, **kwargs)


def image_rows(payload: bytes):
    """An image's "encoding": 3 + payload[0] % 4 rows drawn from a generator seeded by its bytes
    (payloads with the same first byte encode to the same length)."""
    seed = int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "little") >> 1
    return torch.randn(3 + payload[0] % 4, HIDDEN, generator=torch.Generator().manual_seed(seed))


def page_kv(rows) -> list:
    """The K/V of a page, per (layer, slice) chunk in the pool's order, from its positions' rows."""
    item = rows.reshape(P, LAYOUT.heads, LAYOUT.head_dim)
    return [item * (chunk + 1) for chunk in range(len(LAYOUT.sub_names) * len(LAYOUT.slice_names))]


def read_page(kv: KVSession, slot: int) -> list:
    return [view.clone() for view in kv.view(None, slot)]


def prefill(kv: KVSession, plan: PrefillPlan) -> dict[int, list]:
    """Prefill `plan` as a driver would: allocate its new pages, walk the frames in order (each
    page's K/V made only from the frames' hidden rows), commit each frame's completed pages as
    soon as they are whole. Returns page -> the K/V written."""
    slots = dict(zip(range(plan.hit_pages, len(plan.keys)), kv.allocate(plan.new_keys), strict=True))
    rows: dict[int, object] = {}
    written = {}
    for frame in plan.frames:
        for i in range(frame.length):
            rows[frame.offset + i] = frame.hidden[i]
        for page in range(frame.first_page, frame.first_page + len(frame.keys)):
            pages = page_kv(torch.stack([torch.as_tensor(rows[t]) for t in range(page * P, (page + 1) * P)]))
            for view, value in zip(kv.view(None, slots[page]), pages, strict=True):
                view.copy_(value)
            written[page] = pages
        if frame.keys:
            kv.commit(list(frame.keys), start=frame.first_page)
    return written


def expected_kv(plan: PrefillPlan, page: int) -> list:
    return page_kv(plan.hidden(page * P, (page + 1) * P))


def same_pages(a: list, b: list) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def session(pool: KVPool, name: str, owner: str) -> KVSession:
    return KVSession(pool, name, owner, hasher=page_hashes)


@sync
async def test_the_driver_writes_each_new_page_once_from_the_frames_rows():
    pool = make_pool()
    try:
        model = Model()
        matcher = model.matcher()
        from flowrt.compute.prefix import Text

        async with session(pool, "s", "r1") as kv:
            plan = await matcher.full(kv, [Text(list(range(1, 11)))])
            written = prefill(kv, plan)
        assert sorted(written) == [0, 1]  # 10 tokens: two full pages, a partial one without a key
        async with session(pool, "s", "r2") as kv:
            hit = await kv.match(list(plan.keys))
            assert hit.pages == 2
            for page, slot in enumerate(hit.slots):
                assert same_pages(read_page(kv, slot), written[page])
                assert same_pages(written[page], expected_kv(plan, page))
    finally:
        pool.close()
