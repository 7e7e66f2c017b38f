"""Deterministic roles for the agent loop: the agent adds numbers with a calculator tool, one
call per round, and answers when nothing is left to add."""

from __future__ import annotations


class Agent:
    async def think(self, ctx, question=None, observation=None):
        state = ctx.globals["history"]
        if question is not None:
            state["pending"] = [int(n) for n in question.split("+")]
            state["total"] = 0
        else:
            state["total"] = observation["result"]
        if state["pending"]:
            yield {"tool_call": {"tool": "add", "args": [state["total"], state["pending"].pop(0)]}}
        else:
            yield {"answer": f"the sum is {state['total']}"}


class Tools:
    async def run(self, ctx, tool_call):
        if tool_call["tool"] != "add":
            raise ValueError(f"unknown tool {tool_call['tool']}")
        return {"observation": {"result": sum(tool_call["args"])}}
