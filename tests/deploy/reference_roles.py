"""Role classes for the property test under `--deploy local`: the same behaviour as the
embedded run's `Role`, importable by replica processes. A test writes `m.py` beside its
program, which calls `roles_for` with the spec, the behaviour's name and a log file; each
activation appends one line to the log (its node and inputs), read back by the test."""

from __future__ import annotations

import os
import random
import zlib

from tests.runtime.harness import jitter
from tests.runtime.reference import freeze

TEMPLATE = """from tests.deploy.reference_roles import roles_for
globals().update(roles_for({spec!r}, {behaviour!r}, {log!r}, {seed!r}))
"""


def behaviour_named(name: str, spec):
    from tests.runtime import test_against_reference as t

    return t.session_chain if name == "session_chain" else t.behaviour_for(spec)


def roles_for(fields: dict, behaviour_name: str, log_path: str, seed: int) -> dict:
    from tests.runtime.test_against_reference import Spec

    spec = Spec(**fields)
    behaviour = behaviour_named(behaviour_name, spec)

    def role(node: str):
        class Role:
            def __init__(self):
                self.rng = random.Random(zlib.crc32(f"{seed} {node} {os.getpid()}".encode()))

            async def run(self, ctx, **inputs):
                record = (node, tuple(sorted((k, freeze(v)) for k, v in inputs.items())))
                with open(log_path, "a") as log:
                    log.write(repr(record) + "\n")
                await jitter(self.rng)
                for frame in behaviour(node, inputs):
                    await jitter(self.rng, 2)
                    yield frame

        return Role

    classes = {f"R{i}": role(f"r{i}.run") for i in range(len(spec.outputs))}
    classes["Gather"] = role("gather.run")
    return classes


def run_deployed(spec, behaviour, text: str, seed: int, tmp_path, deploy: str) -> tuple[list[dict], list]:
    """Run the program under `deploy`: (its events, the activations the replicas logged)."""
    import ast
    import asyncio
    import dataclasses
    import uuid

    from tests.deploy.helpers import assert_clean_everywhere, calls, deployed
    from tests.runtime import test_against_reference as t
    from tests.runtime.harness import bundle_of

    name = "session_chain" if behaviour is t.session_chain else "spec"
    log_path = tmp_path / f"activations-{uuid.uuid4().hex[:8]}.log"
    (tmp_path / "m.py").write_text(TEMPLATE.format(spec=dataclasses.asdict(spec), behaviour=name, log=str(log_path), seed=seed))
    bundle = bundle_of(text, tmp_path)

    async def main():
        async with deployed(bundle, deploy) as deployment:
            events = await asyncio.wait_for(calls(deployment.runtime, "g", {"request": t.REQUEST}), 20)
            await assert_clean_everywhere(deployment)
        return events

    events = asyncio.run(main())
    log = [ast.literal_eval(line) for line in log_path.read_text().splitlines()] if log_path.exists() else []
    return events, log
