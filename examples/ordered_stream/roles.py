"""Deterministic roles for the ordered stream example: four stylist replicas finish out of
order; the session editor and the ordered stream put lines back in production order."""

from __future__ import annotations

import asyncio


class Writer:
    async def write(self, ctx, prompt):
        for word in prompt.split():
            yield {"token": word}


class Stylist:
    async def style(self, ctx, token):
        for _ in range(4 * (len(token) % 4)):  # longer words take longer: out of order, deterministically
            await asyncio.sleep(0)
        return {"styled": token.upper()}


class Editor:
    def __init__(self):
        self.count = 0

    async def edit(self, ctx, styled):
        self.count += 1
        return {"line": f"{self.count}: {styled}"}
