"""Chat turn-2 time to first token through the real server: a session's turn 2 reusing turn 1's
KV pages vs the same turn 2 with nothing to reuse.

Starts `flowc run examples/chat --http` (`--deploy inproc`, torch on one thread), then per round:
turn 1 of a new conversation (a long system prompt, a question), then its turn 2 in the same
session (reuse: turn 1's pages are found), and the same turn 2 with a different first word of
the system prompt (a fresh history of the same length: no page matches, since a page's key
chains every token before it). Time to first token is the client's: the request sent to the
first content chunk of `/v1/chat/completions` streaming. Prints a Markdown table.

    .venv/bin/python bench/chat_reuse.py            # about 1,500-token histories, 5 rounds
    .venv/bin/python bench/chat_reuse.py --quick    # short histories, 2 rounds
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import openai

REPO = Path(__file__).resolve().parent.parent


def first_token_seconds(client: openai.OpenAI, session: str, messages: list) -> tuple[float, str, dict]:
    """Seconds to the first content chunk, the reply's text and the `generation` counts."""
    started = time.perf_counter()
    first = None
    text = []
    flow = {}
    stream = client.chat.completions.create(
        model="chat", messages=messages, stream=True, extra_headers={"X-Flow-Session": session}
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first if first is not None else time.perf_counter() - started
            text.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            flow = chunk.flow["generation"]
    return first, "".join(text), flow


def conversation(words: int, first_word: str) -> list[dict]:
    system = first_word + " " + " ".join(f"rule {n}: pages are keyed by the tokens before them." for n in range(words // 9))
    return [{"role": "system", "content": system}, {"role": "user", "content": "How is a page found again?"}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short histories, 2 rounds")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    words, rounds = (120, 2) if args.quick else (1000, args.rounds or 5)
    bundle = Path(tempfile.mkdtemp(prefix="chat-bench-")) / "bundle"
    flowc = [sys.executable, "-m", "flowc"]
    subprocess.run([*flowc, "build", str(REPO / "examples/chat/pipeline.flow"), "-o", str(bundle)], check=True, cwd=REPO)
    server = subprocess.Popen(
        [*flowc, "run", str(bundle), "--http", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        banner = server.stdout.readline()
        if not banner.startswith("serving "):
            raise SystemExit(f"the server did not start: {banner!r}")
        address = banner.split("http://", 1)[1].strip()
        client = openai.OpenAI(base_url=f"http://{address}/v1", api_key="unused", max_retries=0)
        reuse, fresh = [], []
        for n in range(rounds):
            turn_1 = conversation(words, f"round{n}")
            _, reply, _ = first_token_seconds(client, f"r{n}", turn_1)
            turn_2 = [*turn_1, {"role": "assistant", "content": reply}, {"role": "user", "content": "And in another process?"}]
            seconds, text, counts = first_token_seconds(client, f"r{n}", turn_2)
            reuse.append((seconds, counts))
            other = [{**turn_2[0], "content": "x" + turn_2[0]["content"]}, *turn_2[1:]]
            seconds, _, counts = first_token_seconds(client, f"f{n}", other)
            fresh.append((seconds, counts))
    finally:
        os.kill(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    print("| turn 2 | history tokens | reused | computed | time to first token (median) |")
    print("|---|---|---|---|---|")
    for name, rows in (("reuse", reuse), ("fresh", fresh)):
        counts = rows[-1][1]
        median = statistics.median(seconds for seconds, _ in rows)
        print(
            f"| {name} | {counts['prompt_tokens']} | {counts['reused_tokens']} | {counts['computed_tokens']} | {median * 1000:.1f} ms |"
        )


if __name__ == "__main__":
    main()
