"""Reading .flow source text: the one reader `check`, `fmt`, `plan`, `build`, imports and the
language server share.

Sources are UTF-8. A byte-order mark at the start of a file (some Windows editors write one) is
accepted and is not part of the text the compiler sees, so positions are the ones the user's
editor shows; `SourceText.bom` remembers it so `flowc fmt` writes it back (formatting changes
layout, never the encoding). Text that reaches the parser another way (the language server gets
it from the editor) may still start with a BOM: `split_bom` separates it.
"""

from __future__ import annotations

import errno
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

BOM = "\ufeff"
# Far above any real pipeline (the 10,000-role benchmark file is ~2 MB); reading `/dev/zero` or a
# mistaken multi-gigabyte file stops here instead of exhausting memory.
MAX_SOURCE_BYTES = 64 * 1024 * 1024


class NotASource(OSError):
    """A path that names something other than a readable .flow text (a device, a socket, a
    file over MAX_SOURCE_BYTES). Its `strerror` says what, for the caller's message."""


@dataclass(frozen=True)
class SourceText:
    text: str  # without the byte-order mark
    bom: str = ""  # BOM if the file started with one, else ""

    @property
    def original(self) -> str:
        """The text as stored in the file."""
        return self.bom + self.text


def split_bom(text: str) -> SourceText:
    if text.startswith(BOM):
        return SourceText(text[len(BOM) :], BOM)
    return SourceText(text)


def read_source(path: Path) -> SourceText:
    """Read and decode `path`; raises OSError (NotASource included) or UnicodeDecodeError,
    and callers name the file. A regular file or a pipe (`<(generate)`) is read; a device or a
    socket is refused before reading, since it may never end."""
    mode = path.stat().st_mode
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        kind = "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file"
        raise NotASource(errno.EINVAL, f"it is {kind}, not a text file", str(path))
    with path.open("rb") as stream:
        return read_stream(stream, str(path))


def read_stream(stream: BinaryIO, name: str) -> SourceText:
    """Read a .flow text from a binary stream (a file, or stdin's buffer: decoding it ourselves
    means bytes that are not UTF-8 are an error, not surrogates the parser would choke on)."""
    data = stream.read(MAX_SOURCE_BYTES + 1)
    if len(data) > MAX_SOURCE_BYTES:
        raise NotASource(errno.EFBIG, f"it is larger than {MAX_SOURCE_BYTES // 2**20} MiB, too large for a .flow file", name)
    # as text mode reads it: \r\n and a lone \r are line ends
    return split_bom(data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n"))
