"""How far a stream may run ahead of what consumes it (docs/runtime.md, rule 13).

A streaming activation gives the loop a turn every `PAUSE_EVERY` frames, so timeouts and
cancellation reach a role that never awaits. It waits while its caller has `OUTBOX_HIGH`
events not yet taken, or while `CHILDREN_HIGH` activations its frames readied have not
finished, and goes on once they fall to half that. The compiled core copies these values
when it is imported; this module is plain Python so tests and tools can read them.
"""

import asyncio
from types import AsyncGeneratorType
from typing import Any

PAUSE_EVERY = 64
OUTBOX_HIGH = 256
CHILDREN_HIGH = 256


async def drain(result: Any) -> None:
    """Run a broadcast replica's activation to its end (only the chosen replica's frames count),
    giving the loop a turn every PAUSE_EVERY frames as any stream does."""
    if type(result) is AsyncGeneratorType:
        frames = 0
        async for _ in result:
            frames += 1
            if frames % PAUSE_EVERY == 0:
                await asyncio.sleep(0)
    else:
        await result
