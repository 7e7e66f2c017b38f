"""Deterministic roles for the diamond example: each frame of a clip is described by two
encoders whose halves must meet in one activation of `fuse`."""

from __future__ import annotations

import asyncio


class Split:
    async def frames(self, ctx, clip):
        for index, pixel in enumerate(clip["frames"]):
            yield {"frame": {"index": index, "pixel": pixel}}


class Color:
    async def encode(self, ctx, frame):
        for _ in range(3 * (frame["index"] % 3)):  # finish out of order on purpose, deterministically
            await asyncio.sleep(0)
        return {"color_feat": {"index": frame["index"], "color": frame["pixel"]["rgb"]}}


class Shape:
    async def encode(self, ctx, frame):
        return {"shape_feat": {"index": frame["index"], "shape": frame["pixel"]["shape"]}}


class Fuse:
    async def combine(self, ctx, color_feat, shape_feat):
        assert color_feat["index"] == shape_feat["index"], "halves of different frames met"
        return {"summary": f"frame {color_feat['index']}: {color_feat['color']} {shape_feat['shape']}"}
