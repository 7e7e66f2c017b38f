"""Deterministic roles for the count join example: a request carries a prompt and any number
of reference images; the painter runs once, after every reference was encoded."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Picture:
    prompt: str
    conditions: int

    def summary(self) -> dict:
        return {"image": {"prompt": self.prompt, "conditions": self.conditions}}


class Reader:
    async def read(self, ctx, request):
        yield {"prompt": request["prompt"]}
        for reference in request.get("references", []):
            yield {"reference": reference}


class Encoder:
    async def encode(self, ctx, reference):
        return {"condition": [float(len(reference))]}


class Painter:
    async def paint(self, ctx, prompt, condition):
        return {"picture": Picture(prompt=prompt[0], conditions=len(condition))}
