"""Text roles: a whitespace tokenizer and its inverse, dependency-free."""

from __future__ import annotations


class Tokenizer:
    async def tokenize(self, ctx, prompt):
        return {"prompt_tokens": prompt.split()}


class Detokenizer:
    async def detokenize(self, ctx, output_tokens):
        return {"output_text": " ".join(output_tokens)}
