"""The roles of lib/omni.flow: any-to-any chat on real tiny models (docs/stdlib.md, "The `omni`
module"): text, images and audio in, in any order; text and speech out, streamed.

    Frontend.parse        omni_request -> stream omni_audio (each clip), omni_image (each image),
                          then omni_prompt (the turn's layout: text ids, clip numbers, image
                          content hashes); segments or an OpenAI chat body, as the voice module's
    AudioEncoder.encode   omni_audio -> omni_audio_emb (the voice module's encoder and cache)
    Vit.encode            omni_image -> omni_vit_emb (the multimodal module's ViT and cache)
    Thinker.generate      join {omni_prompt: 1, omni_audio_emb: all, omni_vit_emb: all} -> stream
                          answer (text pieces), spoken (each sampled id, for the voice talker),
                          then omni_turn (the counts, as the voice thinker's `turn`)

They are the voice module's frontend, encoder and thinker and the multimodal module's ViT,
under fields of their own (so the voice and multimodal graphs of a bundle that imports this
module too are left as they are): an image is decoded as the multimodal frontend decodes it,
and its ViT rows enter the thinker's prompt where the image stood, as an audio clip's do. The
thinker is the voice module's model, on its KV pages; the voice talker speaks the answer as it
speaks a voice reply.
"""

from __future__ import annotations

from flowstd.roles import multimodal, voice


class Frontend(voice.Frontend):
    prompt_field, audio_field = "omni_prompt", "omni_audio"
    images, image_field = True, "omni_image"

    async def parse(self, ctx, omni_request):
        async for frame in self.frames(omni_request):
            yield frame


class AudioEncoder(voice.AudioEncoderRole):
    async def encode(self, ctx, omni_audio):
        return {"omni_audio_emb": (await super().encode(ctx, omni_audio))["audio_emb"]}


class Vit(multimodal.Vit):
    async def encode(self, ctx, omni_image):
        return {"omni_vit_emb": (await super().encode(ctx, omni_image))["vit_emb"]}


class Thinker(voice.Thinker):
    reply_field, turn_field = "answer", "omni_turn"

    async def generate(self, ctx, omni_prompt, omni_audio_emb=(), omni_vit_emb=()):
        async for frame in self.think(ctx, omni_prompt, omni_audio_emb, omni_vit_emb):
            yield frame
