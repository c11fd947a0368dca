"""The fake's VICI codec agrees with strongSwan's own client, byte for byte."""

from __future__ import annotations

from typing import Any

import pytest
from vici.protocol import FiniteStream, Message

from tests.fakes.fake_charon import decode_message, encode_message

SAMPLE: dict[str, Any] = {
    "qoss-t1": {
        "version": "2",
        "local_addrs": ["10.99.0.1"],
        "proposals": ["aes128-sha256-modp2048"],
        "local": {"auth": "psk", "id": "left"},
        "children": {"qoss-t1": {"esp_proposals": ["aes128gcm16"], "local_ts": ["10.1.0.1/32", "10.1.0.2/32"]}},
    },
    "data": b"\x00\xffbinary",
    "empty": [],
}


def _bytes(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _bytes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_bytes(v) for v in value]
    return value if isinstance(value, bytes) else str(value).encode()


def test_encoding_matches_vici() -> None:
    assert encode_message(SAMPLE) == Message.serialize(SAMPLE)


def test_decoding_matches_vici() -> None:
    wire = Message.serialize(SAMPLE)
    assert decode_message(wire) == dict(Message.deserialize(FiniteStream(wire))) == _bytes(SAMPLE)


def test_truncated_message_is_refused() -> None:
    with pytest.raises(ValueError, match="truncated"):
        decode_message(encode_message({"key": "value"})[:-2])
