"""The prefill and decode roles of examples/pd_split, on flowstd's llm model (flowstd.roles.llm).

`Prefill.prefill` runs the whole prompt in one step, writing its K/V into pool pages, commits
every page, the trailing partial one included (under a key of its own, chained after the last
full page's), and samples the first token. `Decode.decode` matches the same keys: the prompt's
K/V come from the pool (its own L1, or another process's L2: `peer`), it forks the partial page
into a scratch page of its own (other sessions may share the committed one) and decodes one
token a step after the first. It prefills nothing where every page is found; a page that is not
(evicted, or no shared metadata store between the processes) is recomputed, and counted.

Sampling is greedy unless the request says otherwise (`temperature`, `top_p`, `seed`, as
flowstd's `llm` role reads them). Prefill samples the first token and hands decode the stream's
seed and how many draws it took; decode resumes that stream (`TokenSampler.skip`), so split or
not, a request gets the same tokens: greedy ones equal the unsplit model's, and seeded ones the
`llm` role's for the same seed.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from flowrt.compute.engine import CAPTURE_LOGITS, SamplingParams, StepRequest, TokenSampler, token_slots
from flowrt.compute.engine.driver import allocate
from flowstd.roles.llm import KV, sampling_request, shared_model, token_ids
from flowstd.tokenizer import Tokenizer


def prompt_keys(kv, tokens: list[int]) -> list[str]:
    """The keys of every page of `tokens`: the chained hashes of the full pages, then a key for the
    trailing partial page (its tokens hashed after the last full page's key)."""
    keys = kv.keys(tokens)
    tail = tokens[len(keys) * kv.layout.page_tokens :]
    if tail:
        parent = keys[-1] if keys else "root"
        keys.append("tail-" + hashlib.blake2b(f"{parent}:{tail}".encode(), digest_size=16).hexdigest())
    return keys


async def place_prompt(model, kv, tokens: list[int], *, sampler: TokenSampler | None) -> dict[str, Any]:
    """Match the prompt's pages, compute (and commit) those not found; the prompt's token slots,
    what was reused and computed, and the first token, drawn by `sampler` (None: no token)."""
    need_logits = sampler is not None
    size = kv.layout.page_tokens
    keys = prompt_keys(kv, tokens)
    hit = await kv.match(keys)
    reused = hit.pages
    if need_logits and reused == len(keys):
        reused -= 1  # the last token must run to give the first token's logits: its page is written again (same K/V)
    pages = list(hit.slots[:reused]) + allocate(kv, keys[reused:])
    context = token_slots(pages, size, len(tokens))
    begin = min(reused * size, len(tokens))  # the partial page, when found, holds the prompt's last tokens
    computed = len(tokens) - begin
    first = None
    if computed:
        capture = frozenset({CAPTURE_LOGITS}) if need_logits else frozenset()
        step = StepRequest(token_ids=tokens[begin:], slots=context, capture=capture)
        first = (await model.batcher.step(step, sampler)).token
    if len(keys) > hit.pages:
        kv.commit(keys[hit.pages :], start=hit.pages)
    kv.count_prefix(hit=len(tokens) - computed, computed=computed)  # flowrt_prefix_tokens_total, per role
    return {
        "context": context,
        "reused_tokens": len(tokens) - computed,
        "computed_tokens": computed,
        "sources": sorted(set(hit.sources)),
        "first_token": first,
    }


class Prefill:
    async def setup(self, ctx) -> None:
        self.tokenizer = Tokenizer.load()
        shared_model(ctx)

    async def prefill(self, ctx, chat_tokens: Any, messages: Any) -> dict[str, Any]:
        tokens = token_ids(chat_tokens, "chat_tokens", self.tokenizer.vocab_size)
        sampling, budget = sampling_request(messages)
        sampler = TokenSampler(sampling)
        model = shared_model(ctx)
        async with ctx.kv(KV) as kv:
            model.bind(kv)
            placed = await place_prompt(model, kv, tokens, sampler=sampler)
        prefilled = {"tokens": tokens, "first_token": placed["first_token"], "max_tokens": budget}
        # where decode's sampler resumes: the same params and stream, past the first token's draw
        prefilled["sampling"] = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampler.seed,
            "draws": sampler.draws,
        }
        prefilled["prefill"] = {"computed_tokens": placed["computed_tokens"], "reused_tokens": placed["reused_tokens"]}
        return {"prefilled": prefilled}


class Decode:
    async def setup(self, ctx) -> None:
        self.tokenizer = Tokenizer.load()
        shared_model(ctx)

    async def decode(self, ctx, prefilled: dict[str, Any]):
        tokens, first, budget = prefilled["tokens"], prefilled["first_token"], prefilled["max_tokens"]
        stream = prefilled["sampling"]
        sampler = TokenSampler(SamplingParams(stream["temperature"], top_p=stream["top_p"], seed=stream["seed"]))
        sampler.skip(stream["draws"])
        model = shared_model(ctx)
        async with ctx.kv(KV) as kv:
            model.bind(kv)
            size = kv.layout.page_tokens
            placed = await place_prompt(model, kv, tokens, sampler=None)
            context = list(placed["context"])
            scratch: list[int] = []  # this call's own pages, from the prompt's partial page on
            prefix = f"pd-scratch-{secrets.token_hex(8)}"  # never committed: released when the block ends

            def slot(position: int) -> int:
                index, offset = divmod(position - len(tokens) // size * size, size)
                while len(scratch) <= index:
                    scratch.extend(kv.allocate([f"{prefix}-{len(scratch)}"]))
                return scratch[index] * size + offset

            tail = range(len(tokens) // size * size, len(tokens))
            if tail:  # fork the shared partial page: the generated tokens' K/V go after it, in a page of our own
                forked = [slot(position) for position in tail]
                model.engine.copy_slots([context[position] for position in tail], forked)
                context[tail.start :] = forked
            generated = [first]
            yield {"generated_tokens": [first]}
            steps = 0
            while len(generated) < budget and generated[-1] != self.tokenizer.eos_id:
                position = len(tokens) + len(generated) - 1
                context.append(slot(position))
                step = StepRequest(token_ids=generated[-1:], slots=context)
                generated.append(int((await model.batcher.step(step, sampler)).token))
                steps += 1
                yield {"generated_tokens": [generated[-1]]}
        yield {
            "split": {
                "prefill": prefilled["prefill"],
                "decode": {
                    "reused_tokens": placed["reused_tokens"],
                    "computed_tokens": placed["computed_tokens"],  # prompt tokens decode prefilled itself
                    "decode_steps": steps,
                    "sources": placed["sources"],
                },
                "tokens": generated,  # the generated ids, to compare with the unsplit model's
            }
        }
