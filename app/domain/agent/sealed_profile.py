"""The form of a device profile left at Host for a one-time link: sealed by the client. Pure.

Host relays a profile it can neither read nor change undetected. The client encrypts the
profile with AES-256-GCM under a random 32-byte key that travels only in the link's fragment
(``<Host>/ui/handoff#t=<secret>&k=<key>``, which a browser never sends to a server); Host
keeps and serves this sealed form, and the phone's browser opens it (``static/handoff.js``).

A sealed profile is one line of clear text, then the 12-byte nonce, then the ciphertext with
its 16-byte tag::

    qoss-handoff/1 <media type> <file name>\\n || nonce || AES-256-GCM(key, nonce, profile, aad=line)

The line (newline included) is the AES-GCM associated data: Host may read the media type and
the file name (it keeps only the types of :data:`~app.services.agent.host.HANDOFF_TYPES`), but
a change to either, to the nonce or to one bit of the ciphertext makes the page refuse it.
The AES-GCM itself is done at the edges (``cryptography`` in the client, WebCrypto or the
vendored noble-ciphers in the browser); this module says what the bytes are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.domain.errors import InvalidInput

__all__ = ["KEY_BYTES", "MAGIC", "NONCE_BYTES", "TAG_BYTES", "SealedProfile", "header", "read_sealed"]

#: The first word of a sealed profile's line, with its version.
MAGIC = b"qoss-handoff/1"
#: AES-256: the key in the link's fragment.
KEY_BYTES = 32
#: AES-GCM's 96-bit nonce, random per profile.
NONCE_BYTES = 12
#: AES-GCM's full 128-bit tag.
TAG_BYTES = 16

_LINE = re.compile(rb"^qoss-handoff/1 ([a-z0-9.+/-]{3,60}) ([A-Za-z0-9][A-Za-z0-9._-]{0,79})\n")
_MAX_LINE = 160


@dataclass(frozen=True, slots=True)
class SealedProfile:
    """A sealed profile read apart (nothing decrypted): what Host may see of it."""

    media_type: str
    name: str
    #: The clear line with its newline: the associated data.
    aad: bytes
    nonce: bytes
    #: Ciphertext and tag.
    ciphertext: bytes


def header(*, media_type: str, name: str) -> bytes:
    """The clear line of a profile named ``name`` of ``media_type`` (its associated data).

    Raises:
        InvalidInput: a media type or a file name the line cannot carry.
    """
    line = MAGIC + b" " + media_type.encode("ascii", "replace") + b" " + name.encode("ascii", "replace") + b"\n"
    if _LINE.fullmatch(line) is None:
        raise InvalidInput(f"a sealed profile cannot be named {name!r} of type {media_type!r}")
    return line


def read_sealed(data: bytes) -> SealedProfile:
    """Read a sealed profile apart (its line, nonce and ciphertext), decrypting nothing.

    Raises:
        InvalidInput: not a sealed profile (a profile in clear, among others).
    """
    end = data.find(b"\n", 0, _MAX_LINE)
    line = _LINE.fullmatch(data[:end + 1]) if end > 0 else None
    if line is None or len(data) < end + 1 + NONCE_BYTES + TAG_BYTES + 1:
        raise InvalidInput(f"not a profile sealed for a one-time link ({MAGIC.decode()})")
    rest = data[end + 1:]
    return SealedProfile(media_type=line.group(1).decode("ascii"), name=line.group(2).decode("ascii"),
                         aad=data[:end + 1], nonce=rest[:NONCE_BYTES], ciphertext=rest[NONCE_BYTES:])
