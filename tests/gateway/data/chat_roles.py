"""Roles of the gateway's test pipeline: deterministic, and steered by the prompt's words.

`boom` makes the writer raise there (after the words before it reached the caller); `wait`
makes it wait two minutes (until its call is cancelled).
"""

from __future__ import annotations

import asyncio


class Writer:
    async def write(self, ctx, prompt):
        for word in prompt.split():
            if word == "boom":
                raise RuntimeError("the writer hit `boom`")
            if word == "wait":
                await asyncio.sleep(120)
            yield {"word": word}


class Shaper:
    async def shape(self, ctx, word):
        for _ in range(4 * (len(word) % 4)):  # longer words take longer: out of order, deterministically
            await asyncio.sleep(0)
        return {"piece": word + " "}


class Helper:
    async def count(self, ctx, prompt):
        return {"words": {"count": len(prompt.split()), "session": ctx.session}}

    async def glue(self, ctx, left, right):
        return {"joined": left + right}

    async def greet(self, ctx, name):
        return {"greeting": f"hello, {name}"}


class Replier:
    async def reply(self, ctx, request):
        for word in request["messages"][-1]["content"].split():
            yield {"answer": word.upper() + " "}

    async def inspect(self, ctx, request):
        return {"seen": {"model": request["model"], "messages": len(request["messages"]), "keys": sorted(request)}}

    async def number(self, ctx, query):
        for i in range(3):
            yield {"number": {"n": i}}


class Counter:
    async def speak(self, ctx, order):
        words = order["messages"][-1]["content"].split()
        said = words[: order.get("budget", len(words))]  # (ignores max_tokens: the endpoint caps what it sends)
        for word in said:
            yield {"spoken": word.upper() + " "}
        # after the text, as flowstd's llm reports its end and its counts
        yield {"tally": {"words": len(said), "finish_reason": "stop" if said == words else "length"}}
        if "budget" in order:
            tally = {"prompt_tokens": len(words), "completion_tokens": len(said) * 10}
            yield {"tally": {**tally, **({"reused_tokens": order["reused"]} if "reused" in order else {})}}
