"""Roles of duplex.flow (a streaming entry met every way a stream producer's field is): plain
functions of their inputs, so a run's events are known in advance."""


class Listener:
    async def hear(self, ctx, audio_in):
        for word in str(audio_in).split():
            yield {"heard": word}


class Mixer:
    async def mix(self, ctx, audio_in, voice):
        return {"mixed": {"voice": voice, "chunks": list(audio_in)}}


class Sampler:
    async def keep(self, ctx, audio_in):
        return {"first": list(audio_in)}


class Counter:
    async def count(self, ctx, heard):
        return {"total": len(heard)}
