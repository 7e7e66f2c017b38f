"""Small deterministic stand-ins for the image_chat roles: the pipeline's shape, not its models.

Embeddings are short lists of floats; images are `Image` records summarised by size. The LLM
describes each segment in tokens and keeps a per-session history in the `kv` global.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Image:
    width: int
    height: int
    mode: str = "RGB"

    def summary(self) -> dict:
        return {"image": {"width": self.width, "height": self.height, "mode": self.mode}}


class Frontend:
    async def parse(self, ctx, request):
        for segment in request["segments"]:
            if segment["type"] == "text":
                yield {"text_seg": segment}
            else:
                yield {"image_seg": segment}


class Embed:
    async def encode(self, ctx, text_seg):
        words = text_seg["text"].split()
        return {"txt_emb": [float(len(w)) for w in words]}


class Vit:
    async def encode(self, ctx, image_seg):
        return {"vit_emb": [float(image_seg["width"]), float(image_seg["height"])]}


class Vae:
    async def encode(self, ctx, image_seg):
        return {"vae_lat": [image_seg["width"] / 8, image_seg["height"] / 8]}

    async def decode(self, ctx, latent):
        return {"image": Image(width=int(latent[0]) * 64, height=int(latent[1]) * 64)}


class Llm:
    async def generate(self, ctx, txt_emb=None, vit_emb=None, vae_lat=None):
        history = ctx.globals["kv"].setdefault("turns", [])
        if txt_emb is not None:
            tokens = ["heard", f"{len(txt_emb)}", "words"]
        else:
            tokens = ["saw", f"{int(vit_emb[0])}x{int(vit_emb[1])}", "image"]
        history.append(tokens)
        for token in tokens:
            yield {"token": token}
        yield {"hidden": [float(len(history)), float(len(tokens))]}


class Dit:
    async def denoise(self, ctx, hidden, vit_emb, vae_lat):
        # one latent from every hidden state and every image condition of the call
        return {"latent": [float(len(hidden) + len(vit_emb)), float(len(hidden) + len(vae_lat))]}
