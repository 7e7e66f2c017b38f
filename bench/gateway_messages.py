"""What a call costs the gateway under `--deploy local` as its graph grows, in ONE run: the
messages it sends to and receives from replicas per call, and its CPU time per call, for
chains of 1, 10 and 40 trivial stages (entry → s0 → s1 → ... → return), side by side under
both controls: `gateway` (every activation a round trip through the gateway, so both grow with
the chain) and `shards` (FLOWRT_CONTROL=shards: each replica hosts its role's part of the call
and sends its frames on itself; docs/design/decentralised.md). "less idle" subtracts what the
gateway process spends over as long a time with no call (the registry's heartbeats from every
replica, its threads), which grows with the replicas, not with the calls.

    python bench/gateway_messages.py [--stages 1,10,40] [--calls 200] [--controls gateway,shards]
"""

from __future__ import annotations

import argparse
import asyncio
import os
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


def counted(supervisor) -> tuple[int, int]:
    """(messages the gateway sent to replicas, messages it received from them), so far."""
    remote = supervisor.remote.statistics()
    sent, received = remote["gateway_messages_sent"], remote["gateway_messages_received"]
    if supervisor.peers is not None:
        sent, received = sent + supervisor.peers.sent, received + supervisor.peers.received
    return sent, received


async def measure(bundle: Path, stages: int, calls: int, control: str) -> dict:
    from flowrt.deploy import open_deployment

    os.environ["FLOWRT_CONTROL"] = control
    deployment = await open_deployment(bundle, "local")
    try:
        for _ in range(5):  # warm: links up, imports done
            [e async for e in deployment.runtime.call("g", {"x0": 0})]
        before = counted(deployment.supervisor)
        cpu, wall = time.process_time(), time.perf_counter()
        for n in range(calls):
            events = [e async for e in deployment.runtime.call("g", {"x0": n})]
            assert events[-1]["status"] == "ok" and events[0]["value"] == n + stages, events
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        after = counted(deployment.supervisor)
        # what the gateway spends meanwhile on no call (heartbeats of every replica, its threads)
        idle = time.process_time()
        await asyncio.sleep(wall)
        idle = time.process_time() - idle
    finally:
        await deployment.close()
    sent, received = (after[0] - before[0]) / calls, (after[1] - before[1]) / calls
    return {
        "control": control,
        "stages": stages,
        "sent": sent,
        "received": received,
        "cpu_us": cpu / calls * 1e6,
        "net_us": (cpu - idle) / calls * 1e6,
        "wall_us": wall / calls * 1e6,
    }


async def main(stage_counts: list[int], calls: int, controls: list[str]) -> None:
    rows = []
    for stages in stage_counts:
        with tempfile.TemporaryDirectory(prefix="flowrt-chain-") as scratch:
            bundle = build(Path(scratch), stages)
            for control in controls:
                rows.append(await measure(bundle, stages, calls, control))
    print(
        f"{'control':>8} {'stages':>6} {'sent/call':>10} {'received/call':>14} {'gateway CPU µs/call':>20} "
        f"{'x 1st':>6} {'less idle':>10} {'x 1st':>6} {'wall µs/call':>13}"
    )
    for row in rows:
        base = next(r for r in rows if r["control"] == row["control"])
        print(
            f"{row['control']:>8} {row['stages']:>6} {row['sent']:>10.1f} {row['received']:>14.1f} {row['cpu_us']:>20.0f} "
            f"{row['cpu_us'] / base['cpu_us']:>6.2f} {row['net_us']:>10.0f} {row['net_us'] / base['net_us']:>6.2f} "
            f"{row['wall_us']:>13.0f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", default="1,10,40", help="comma-separated chain lengths")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--controls", default="gateway,shards", help="comma-separated: gateway, shards")
    args = parser.parse_args()
    asyncio.run(main([int(s) for s in args.stages.split(",")], args.calls, args.controls.split(",")))
