"""Compile speed: parse, check and plan time for generated programs of 100 / 1,000 / 10,000 roles.

The generated pipeline is layered like real ones: each role consumes one or two fields of
earlier roles (so there are diamonds and OR groups), some stream, some share GPUs, and one graph
returns the last fields. Reported: best-of-N wall time per phase, time per role, and growth
from each size to the next (10x the roles; near-linear growth is about 10x the time).
Goals: parse+check of 1,000 roles in at most 1 s; plan of 1,000 / 10,000 roles in at most
1 s / 10 s; near-linear growth. "check" includes the graph-analysis checks (phase 2), which
build the per-graph IR; "plan" is `build_plan` on a freshly checked program (IR built again).

    python bench/compile_bench.py [--sizes 100,1000,10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from flowc.check import check_source  # noqa: E402
from flowc.gcpause import gc_paused  # noqa: E402
from flowc.plan import build_plan  # noqa: E402
from flowc.syntax import parse  # noqa: E402


def _single_group(i: int) -> list[int]:
    """Earlier roles, within a window of 20, that have one input group."""
    return [j for j in range(max(0, i - 20), i) if j % 5 != 0 or j == 0]


def generate(roles: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    inputs: list[str] = []
    consumed: set[int] = set()
    for i in range(roles):
        if i == 0:
            inputs.append("request")
        elif i % 5 == 0 and i >= 2:
            # a bucket in an OR group; roles with two groups are consumed by nobody, so no later
            # bucket receives several frames of one key from them (E209)
            a, b, c = rng.sample(_single_group(i), 3)
            inputs.append(f"f{a} & f{b} | f{c}")
            consumed.update((a, b, c))
        else:
            a = rng.choice(_single_group(i))
            inputs.append(f"f{a}")
            consumed.add(a)
    out = ["flow generated", "", "placeholder request: Json", ""]
    for i in range(roles):
        lines = [f"role r{i} {{", f'    impl "generated.roles:R{i}"']
        if i % 7 == 0:
            lines.append(f"    replicas {rng.randint(1, 4)}")
            lines.append("    lb round_robin")
        if i % 50 == 0:
            lines.append("    gpus 1")
        elif i % 50 == 1:
            lines.append(f"    share gpus with r{i - 1}")
        # streaming roles are ones nothing consumes, so no bucket gets several frames per key (E209)
        stream = "stream " if i % 3 == 0 and i not in consumed else ""
        lines += [f"    interface run{i} {{", f"        in  {inputs[i]}", f"        out {stream}f{i}: Tensor", "    }", "}", ""]
        out += lines
    returned = [f"f{i}" for i in range(roles) if i not in consumed]
    out += ["graph g {", "    entry  request", f"    return {', '.join(returned)}", "}", ""]
    return "\n".join(out)


def plan_time(text: str, repeat: int) -> float:
    """`build_plan` alone, best of `repeat`: checked first (untimed), cached IR dropped each time."""
    program = check_source(text, "generated.flow").program
    times = []
    for _ in range(repeat):
        program.derived.clear()
        began = time.perf_counter()
        with gc_paused():
            build_plan(program)
        times.append(time.perf_counter() - began)
    return min(times)


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def print_build_table(sizes: list[int]) -> None:
    """`flowc build` end to end in-process (check, plan, render, write), once per size."""
    import shutil
    import tempfile

    from flowc.codegen import build_bundle

    print("| roles | build (check+plan+render+write) | files | bundle size | per role |")
    print("|---:|---:|---:|---:|---:|")
    for size in sizes:
        text = generate(size)
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "generated.flow"
            source.write_text(text)
            out = Path(tmp) / "bundle"
            began = time.perf_counter()
            program = check_source(text, "generated.flow", source).program
            with gc_paused():
                bundle = build_bundle(program, source, out)
            bundle.write(out)
            elapsed = time.perf_counter() - began
            on_disk = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
            shutil.rmtree(out)
        print(
            f"| {size:,} | {elapsed:.2f} s | {len(bundle.files):,} | {on_disk / 2**20:.1f} MiB | {elapsed / size * 1e3:.2f} ms |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    parse("")  # load the grammar once, outside the timings
    rows = []
    for size in sizes:
        text = generate(size)
        result = check_source(text, "generated.flow")
        assert result.ok, [d.message for d in result.diagnostics[:3]]
        parse_s = best_of(args.repeat, lambda text=text: parse(text, "generated.flow"))
        check_s = best_of(args.repeat, lambda text=text: check_source(text, "generated.flow"))
        plan_s = plan_time(text, args.repeat)
        rows.append((size, len(text.splitlines()), parse_s, check_s, plan_s))
    print_build_table(sizes)
    print()
    print("| roles | lines | parse | parse+check | plan | per role (check+plan) | growth vs previous size |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    previous = None
    for size, lines, parse_s, check_s, plan_s in rows:
        total_s = check_s + plan_s
        growth = f"{total_s / previous[1]:.1f}x for {size // previous[0]}x roles" if previous else "-"
        print(
            f"| {size:,} | {lines:,} | {parse_s * 1000:.0f} ms | {check_s * 1000:.0f} ms | {plan_s * 1000:.0f} ms "
            f"| {total_s / size * 1e6:.0f} µs | {growth} |"
        )
        previous = (size, total_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
