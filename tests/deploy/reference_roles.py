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


HAND_ROLES = 4  # the roles r0..r3 a hand-written program may have (`spec` None)


def behaviour_named(name: str, spec):
    """The behaviour a test names: `session_chain`, `spec` (the spec's own), or `hand:r1,r2`
    (the streaming tests' hand-written topologies, those roles streaming)."""
    from tests.runtime import test_against_reference as t

    if name.startswith("hand:"):
        from tests.runtime.test_streaming_reference import hand_behaviour

        return hand_behaviour({role for role in name[len("hand:") :].split(",") if role})
    return t.session_chain if name == "session_chain" else t.behaviour_for(spec)


def roles_for(fields: dict | None, behaviour_name: str, log_path: str, seed: int) -> dict:
    from tests.runtime.test_against_reference import Spec

    spec = Spec(**fields) if fields is not None else None
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

    count = len(spec.outputs) if spec is not None else HAND_ROLES
    classes = {f"R{i}": role(f"r{i}.run") for i in range(count)}
    classes["Gather"] = role("gather.run")
    return classes


def run_deployed(
    spec, behaviour, text: str, seed: int, tmp_path, deploy: str, drive=None, behaviour_name: str | None = None
) -> tuple[list[dict], list]:
    """Run the program under `deploy`: (its events, the activations the replicas logged).
    `drive(runtime)` makes the call (by default with the reference tests' request);
    `behaviour_name` names the behaviour for the replica processes (`behaviour_named`) where
    it is not the spec's own or `session_chain`."""
    import ast
    import asyncio
    import dataclasses
    import uuid

    from tests.deploy.helpers import assert_clean_everywhere, calls, deployed
    from tests.runtime import test_against_reference as t
    from tests.runtime.harness import bundle_of

    name = behaviour_name or ("session_chain" if behaviour is t.session_chain else "spec")
    fields = dataclasses.asdict(spec) if spec is not None else None
    log_path = tmp_path / f"activations-{uuid.uuid4().hex[:8]}.log"
    (tmp_path / "m.py").write_text(TEMPLATE.format(spec=fields, behaviour=name, log=str(log_path), seed=seed))
    bundle = bundle_of(text, tmp_path)

    async def main():
        async with deployed(bundle, deploy) as deployment:
            making = drive(deployment.runtime) if drive is not None else calls(deployment.runtime, "g", {"request": t.REQUEST})
            events = await asyncio.wait_for(making, 20)
            await assert_clean_everywhere(deployment)
        return events

    events = asyncio.run(main())
    log = [ast.literal_eval(line) for line in log_path.read_text().splitlines()] if log_path.exists() else []
    return events, log
