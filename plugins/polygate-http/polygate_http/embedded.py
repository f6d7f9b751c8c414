"""REST Proxy's embedded formats: how a record's key and value travel inside a JSON request or answer.

``json``: the value itself (stored as its compact JSON text); ``binary``: a base64 string of the
bytes; ``string``: a text, stored as its UTF-8. Bytes that are not UTF-8 (written by a client of
another protocol or format) read as ``string`` come with U+FFFD in place of each bad sequence, as
Java decodes a ``String``: only ``binary`` gives any bytes back exactly.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from polygate_http.codec import HttpError


def decode_embedded(embedded: str, value: Any, what: str) -> bytes | None:
    """The bytes of a record's key or value in its embedded format (``None`` for JSON null)."""
    if value is None:
        return None
    if embedded == "json":
        return json.dumps(value, separators=(",", ":")).encode()
    if embedded == "string":
        if not isinstance(value, str):
            raise HttpError(422, 42200, f"The {what} of a string record must be a string")
        return value.encode()
    if not isinstance(value, str):
        raise HttpError(422, 42200, f"The {what} of a binary record must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise HttpError(422, 42200, f"The {what} of a binary record is not valid base64") from None


def encode_embedded(embedded: str, data: bytes | None) -> Any:
    """A record's key or value as a reply of that embedded format carries it."""
    if data is None:
        return None
    if embedded == "json":
        try:
            return json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return data.decode("utf-8", "replace")  # written by a client of another format
    if embedded == "string":
        return data.decode("utf-8", "replace")
    return base64.b64encode(data).decode()
