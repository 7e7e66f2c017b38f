"""What a call costs the gateway under `--deploy local` as its graph grows, in ONE run: the
messages it sends to and receives from replicas per call, and its CPU time per call, for
chains of 1, 10 and 40 trivial stages (entry → s0 → s1 → ... → return). This is the baseline
decentralised control (docs/design/decentralised.md, issue 31) is to make flat: today every
activation is a round trip through the gateway, so both grow with the chain.

    python bench/gateway_messages.py [--stages 1,10,40] [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

ROLES = """
class Stage:
    async def run(self, ctx, **inputs):
        (value,) = inputs.values()
        return {OUT: value + 1}
"""


def chain(stages: int) -> str:
    """A chain of `stages` one-replica roles, each adding one."""
    lines = ["flow chain", "placeholder x0: Json"]
    for i in range(stages):
        lines += [f"role s{i} {{", f'    impl "chain_roles:S{i}"', f"    interface run {{ in x{i}  out x{i + 1}: Json }}", "}"]
    lines += ["graph g {", "    entry x0", f"    return x{stages}", "}"]
    return "\n".join(lines) + "\n"


def roles(stages: int) -> str:
    classes = [
        textwrap.dedent(ROLES).replace("class Stage", f"class S{i}").replace("OUT", repr(f"x{i + 1}")) for i in range(stages)
    ]
    return "\n".join(classes)


def build(directory: Path, stages: int) -> Path:
    (directory / "pipeline.flow").write_text(chain(stages))
    (directory / "chain_roles.py").write_text(roles(stages))
    bundle = directory / "bundle"
    subprocess.run([sys.executable, "-m", "flowc", "build", str(directory / "pipeline.flow"), "-o", str(bundle)], check=True)
    return bundle


async def measure(bundle: Path, stages: int, calls: int) -> dict:
    from flowrt.deploy import open_deployment

    deployment = await open_deployment(bundle, "local")
    try:
        for _ in range(5):  # warm: links up, imports done
            [e async for e in deployment.runtime.call("g", {"x0": 0})]
        before = deployment.supervisor.remote.statistics()
        cpu, wall = time.process_time(), time.perf_counter()
        for n in range(calls):
            events = [e async for e in deployment.runtime.call("g", {"x0": n})]
            assert events[-1]["status"] == "ok" and events[0]["value"] == n + stages, events
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        after = deployment.supervisor.remote.statistics()
    finally:
        await deployment.close()
    sent = (after["gateway_messages_sent"] - before["gateway_messages_sent"]) / calls
    received = (after["gateway_messages_received"] - before["gateway_messages_received"]) / calls
    return {"stages": stages, "sent": sent, "received": received, "cpu_us": cpu / calls * 1e6, "wall_us": wall / calls * 1e6}


async def main(stage_counts: list[int], calls: int) -> None:
    rows = []
    for stages in stage_counts:
        with tempfile.TemporaryDirectory(prefix="flowrt-chain-") as scratch:
            rows.append(await measure(build(Path(scratch), stages), stages, calls))
    base = rows[0]
    print(f"{'stages':>6} {'sent/call':>10} {'received/call':>14} {'gateway CPU µs/call':>20} {'x 1st':>6} {'wall µs/call':>13}")
    for row in rows:
        print(
            f"{row['stages']:>6} {row['sent']:>10.1f} {row['received']:>14.1f} {row['cpu_us']:>20.0f} "
            f"{row['cpu_us'] / base['cpu_us']:>6.2f} {row['wall_us']:>13.0f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", default="1,10,40", help="comma-separated chain lengths")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main([int(s) for s in args.stages.split(",")], args.calls))
