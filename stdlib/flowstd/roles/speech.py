"""The role of lib/speech.flow: text to speech through the voice module's talker (docs/stdlib.md).

    Reader.read   speech_text -> stream spoken: the text's token ids, one frame each, as the
                  voice thinker sends its reply's, so the talker speaks the text itself

A text is at most MAX_SPEECH_TOKENS tokens (a `BadInput` past that, naming the limit), so one
request cannot hold a talker for minutes or make a WAV of tens of megabytes.
"""

from __future__ import annotations

from flowstd.roles.voice import FRAMES_PER_TOKEN, VoiceInputError, VoiceRuntime

MAX_SPEECH_TOKENS = 1024  # the longest text: 41 s of speech, a 1.3 MB WAV


class Reader:
    """Text to speech (lib/speech.flow): the text's token ids, each as a `spoken` frame for the
    talker, as the thinker sends its reply's; the talker's speech is that of the text itself."""

    async def setup(self, ctx) -> None:
        self.tokenizer = VoiceRuntime.shared().tokenizer

    async def read(self, ctx, speech_text):
        text = speech_text.get("input") if isinstance(speech_text, dict) else speech_text  # (an OpenAI speech body)
        if not isinstance(text, str):
            raise VoiceInputError(f"the text to speak is a string (`input`), not {type(text).__name__}")
        if not text.strip():
            raise VoiceInputError("the text to speak is empty: send a string with words in it (`input`)")
        ids = self.tokenizer.encode(text)
        if len(ids) > MAX_SPEECH_TOKENS:
            raise VoiceInputError(
                f"the text to speak is {len(ids)} tokens; the reader speaks at most {MAX_SPEECH_TOKENS} at once "
                f"(about {MAX_SPEECH_TOKENS * FRAMES_PER_TOKEN // 100} s of speech): send it in parts"
            )
        for index, token in enumerate(ids):
            yield {"spoken": {"token": token, "index": index, "last": index == len(ids) - 1}}
