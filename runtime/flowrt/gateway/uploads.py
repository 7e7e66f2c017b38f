"""Multipart requests on `POST /graphs/GRAPH` (docs/runtime.md, "Serving"): media as uploaded
files instead of base64 in JSON.

A `multipart/form-data` body holds a part named `input`, the JSON object of entry values, and
any number of file parts; a string `file:NAME` in the input is the part named NAME, as a `data:`
URL (flowrt.media.with_files), which the media readers take wherever they take base64:

    curl -F input='{"request": {"segments": [{"type": "image", "url": "file:cat"}]}}' \
         -F cat=@cat.png http://127.0.0.1:8000/graphs/chat

The body was read whole and within the server's limits before (flowrt.gateway.admission); it is
parsed with the standard library's MIME parser. Problems are `UploadError`s naming the part and
the fix. Only uploaded parts can be named: `file:` never reads the server's disk.
"""

from __future__ import annotations

import json
from email.message import EmailMessage
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from flowrt.media import with_files

INPUT = "input"
EXAMPLE = 'curl -F input=\'{"request": ...}\' -F cat=@cat.png (and "file:cat" in the input)'


class UploadError(ValueError):
    """A multipart body that cannot be read as the entry values and their files."""


def multipart_inputs(content_type: str, body: bytes) -> Any:
    """The entry values of a multipart body, its `file:NAME` strings replaced by the parts' data."""
    message = BytesParser(_class=EmailMessage, policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    if not message.is_multipart():
        raise UploadError(f"the multipart body could not be read; send it as {EXAMPLE}")
    parts: dict[str, tuple[bytes, str]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str) or not name:
            raise UploadError(f"a part has no name (Content-Disposition: form-data; name=...); send it as {EXAMPLE}")
        if name in parts:
            raise UploadError(f"the part `{name}` is sent twice; give each part a name of its own")
        data = part.get_payload(decode=True)
        parts[name] = (data if isinstance(data, bytes) else b"", part.get_content_type())
    if INPUT not in parts:
        raise UploadError(f"no part named `{INPUT}` holds the entry values; send it as {EXAMPLE}")
    try:
        inputs = json.loads(parts.pop(INPUT)[0])
    except (ValueError, RecursionError) as error:
        raise UploadError(f"the `{INPUT}` part is not JSON ({error}); send the entry values as a JSON object") from None

    def uploaded(name: str) -> tuple[bytes, str]:
        if name not in parts:
            sent = ", ".join(f"`{n}`" for n in sorted(parts)) or "none"
            raise UploadError(f"`file:{name}` names no part of the request (parts sent: {sent}); upload it as -F {name}=@FILE")
        return parts[name]

    return with_files(inputs, uploaded)
