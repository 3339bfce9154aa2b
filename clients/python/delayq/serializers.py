"""Payload serializers: bytes pass through, str is UTF-8, other objects go through a Serializer."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "CONTENT_TYPE_HEADER",
    "TEXT_CONTENT_TYPE",
    "JsonSerializer",
    "Serializer",
    "decode_payload",
    "encode_payload",
]

#: Header naming how the payload was encoded; absent for raw bytes.
CONTENT_TYPE_HEADER = "content-type"
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"


@runtime_checkable
class Serializer(Protocol):
    """Turns objects into payload bytes and back.

    `content_type` is stored in the job's ``content-type`` header so that a
    consumer knows which serializer decodes the payload.
    """

    content_type: str

    def dumps(self, obj: Any) -> bytes:
        """Encode an object into payload bytes."""
        ...

    def loads(self, data: bytes) -> Any:
        """Decode payload bytes produced by `dumps`."""
        ...


class JsonSerializer:
    """The default serializer: compact UTF-8 JSON."""

    content_type = "application/json"

    def dumps(self, obj: Any) -> bytes:
        """Encode `obj` as compact JSON."""
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()

    def loads(self, data: bytes) -> Any:
        """Decode JSON bytes."""
        return json.loads(data)


def encode_payload(payload: Any, serializer: Serializer) -> tuple[bytes, str | None]:
    """Return the payload bytes and the content type to record (None for raw bytes)."""
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload), None
    if isinstance(payload, str):
        return payload.encode(), TEXT_CONTENT_TYPE
    return serializer.dumps(payload), serializer.content_type


def decode_payload(data: bytes, headers: Mapping[str, str], serializer: Serializer) -> Any:
    """Decode payload bytes by their content-type header; unknown types stay bytes."""
    content_type = headers.get(CONTENT_TYPE_HEADER)
    if content_type is None:
        return data
    if content_type == TEXT_CONTENT_TYPE:
        return data.decode()
    if content_type == serializer.content_type:
        return serializer.loads(data)
    return data
