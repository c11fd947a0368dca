"""Keys, signatures and seals of the tunnel agent .

Every party has an Ed25519 key to sign and a separate X25519 key to be sealed to.
A message is signed (Ed25519 over a context label, its kind and its canonical body) and
then sealed with HPKE (RFC 9180, base mode, DHKEM-X25519 / HKDF-SHA256 /
ChaCha20-Poly1305) to the recipient's X25519 key; the cleartext header is the HPKE
``info`` (with a context label), so it cannot be altered either. Base mode is anonymous,
hence the signature inside. ``cryptography``'s HPKE has no separate AAD argument; the
header in ``info`` binds it just as well (any change gives a different key schedule).

Private keys live in files of mode 0600 and are refused when anyone else may read them.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hpke, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from app.domain.agent import (
    AgentRejected,
    Kind,
    Wire,
    b64d,
    b64e,
    open_plaintext,
    parse_wire,
    seal_plaintext,
    signed_bytes,
    valid_id,
)
from app.domain.agent.wire import limits as wire_limits
from app.domain.errors import InvalidInput

__all__ = [
    "CRYPTO",
    "KeyPair",
    "PublicKeys",
    "load_keys",
    "load_public",
    "open_sealed",
    "seal",
    "verify",
    "write_keys",
]

_SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)


@functools.lru_cache(maxsize=1024)
def _kem_public(raw: bytes) -> X25519PublicKey:
    """A peer's X25519 key object, parsed once (public keys only: nothing secret is cached)."""
    return X25519PublicKey.from_public_bytes(raw)


@functools.lru_cache(maxsize=1024)
def _sign_public(raw: bytes) -> Ed25519PublicKey:
    """A peer's Ed25519 key object, parsed once."""
    return Ed25519PublicKey.from_public_bytes(raw)


@dataclass(frozen=True, slots=True)
class PublicKeys:
    """A party's public keys (32 bytes each): Ed25519 to verify, X25519 to seal to."""

    sign: bytes
    kem: bytes

    def as_dict(self) -> dict[str, str]:
        return {"sign_public_key": b64e(self.sign), "kem_public_key": b64e(self.kem)}

    @classmethod
    def from_text(cls, sign: str, kem: str) -> PublicKeys:
        """From unpadded base64url text.

        Raises:
            InvalidInput: not 32-byte keys in base64url.
        """
        try:
            keys = cls(b64d(sign, size=32), b64d(kem, size=32))
            X25519PublicKey.from_public_bytes(keys.kem)
            Ed25519PublicKey.from_public_bytes(keys.sign)
        except (AgentRejected, ValueError) as exc:
            raise InvalidInput("a public key is 32 bytes in unpadded base64url") from exc
        return keys


class KeyPair:
    """A party's two private keys. Never printed, never serialised except to its key files."""

    __slots__ = ("_kem", "_sign", "name")

    def __init__(self, name: str, sign: Ed25519PrivateKey, kem: X25519PrivateKey) -> None:
        self.name = name
        self._sign = sign
        self._kem = kem

    @classmethod
    def generate(cls, name: str) -> KeyPair:
        if not valid_id(name):
            raise InvalidInput("a key name is 1-63 of a-z, 0-9, '.', '_', '-'")
        return cls(name, Ed25519PrivateKey.generate(), X25519PrivateKey.generate())

    def __repr__(self) -> str:
        return f"KeyPair({self.name!r})"

    @property
    def public(self) -> PublicKeys:
        raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
        return PublicKeys(self._sign.public_key().public_bytes(*raw), self._kem.public_key().public_bytes(*raw))

    def sign(self, kind: Kind, body: bytes) -> bytes:
        return self._sign.sign(signed_bytes(kind, body))

    def decrypt(self, wire: Wire) -> bytes:
        try:
            return _SUITE.decrypt(wire.sealed, self._kem, info=wire.info())
        except (InvalidTag, ValueError) as exc:
            raise AgentRejected("cannot open the seal") from exc

    def seal(self, *, kind: Kind, to: str, body: bytes, recipient: bytes) -> bytes:
        """:func:`seal`, signed by these keys."""
        return seal(kind=kind, to=to, body=body, signer=self, recipient=recipient)

    def open_sealed(self, data: bytes, *, kinds: Sequence[Kind]) -> tuple[Kind, bytes, bytes]:
        """:func:`open_sealed` with these keys."""
        return open_sealed(data, kinds=kinds, me=self)

    def private_pem(self) -> tuple[bytes, bytes]:
        enc = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        return self._sign.private_bytes(*enc), self._kem.private_bytes(*enc)


def seal(*, kind: Kind, to: str, body: bytes, signer: KeyPair, recipient: bytes) -> bytes:
    """Sign ``body`` as ``signer`` and seal body+signature to ``recipient``'s X25519 key; the wire bytes."""
    header = Wire(kind=kind, to=to, sealed=b"")
    plaintext = seal_plaintext(body, signer.sign(kind, body))
    try:
        public = _kem_public(recipient)
    except ValueError as exc:
        raise AgentRejected("not an X25519 public key") from exc
    sealed = _SUITE.encrypt(plaintext, public, info=header.info())
    return Wire(kind=kind, to=to, sealed=sealed).encode()


def open_sealed(data: bytes, *, kinds: Sequence[Kind], me: KeyPair) -> tuple[Kind, bytes, bytes]:
    """Check the header, open the seal with ``me``'s key: (kind, signed body, tag). Not yet verified.

    Raises:
        AgentRejected: too large, malformed, not for ``me``, or the seal does not open.
    """
    wire = parse_wire(data, kinds=kinds, to=me.name)
    body, tag = open_plaintext(me.decrypt(wire), max_size=wire_limits(kinds)[1])
    return wire.kind, body, tag


def verify(public_sign_key: bytes, kind: Kind, body: bytes, tag: bytes) -> None:
    """Check ``tag`` is ``public_sign_key``'s signature of ``body`` as ``kind``.

    Raises:
        AgentRejected: it is not.
    """
    try:
        _sign_public(public_sign_key).verify(tag, signed_bytes(kind, body))
    except (InvalidSignature, ValueError) as exc:
        raise AgentRejected("bad signature") from exc


# --------------------------------------------------------------------------- files


def _paths(directory: Path, name: str) -> tuple[Path, Path, Path]:
    return directory / f"{name}.ed25519", directory / f"{name}.x25519", directory / f"{name}.pub.json"


def write_keys(keys: KeyPair, directory: Path, *, overwrite: bool = False) -> Path:
    """Write ``<name>.ed25519`` and ``<name>.x25519`` (0600) and ``<name>.pub.json``; the public file's path.

    Raises:
        InvalidInput: the files exist already (and ``overwrite`` is false).
    """
    directory.mkdir(parents=True, exist_ok=True)
    sign_path, kem_path, pub_path = _paths(directory, keys.name)
    if not overwrite and any(p.exists() for p in (sign_path, kem_path, pub_path)):
        raise InvalidInput(f"keys for {keys.name} exist already in {directory}")
    for path, pem in zip((sign_path, kem_path), keys.private_pem(), strict=True):
        tmp = path.with_suffix(path.suffix + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(pem)
        tmp.replace(path)
    pub_path.write_text(json.dumps({"id": keys.name, **keys.public.as_dict()}, indent=2) + "\n")
    return pub_path


def _read_private(path: Path) -> bytes:
    try:
        info = path.stat()
    except OSError as exc:
        raise InvalidInput(f"cannot read private key {path}: {exc.strerror}") from exc
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidInput(f"private key {path} may be read by others: chmod 600 it")
    return path.read_bytes()


def load_keys(directory: Path, name: str) -> KeyPair:
    """Load ``name``'s private keys from ``directory``.

    Raises:
        InvalidInput: missing, unreadable, readable by others, or not the right kind of key.
    """
    sign_path, kem_path, _ = _paths(directory, name)
    try:
        sign = serialization.load_pem_private_key(_read_private(sign_path), password=None)
        kem = serialization.load_pem_private_key(_read_private(kem_path), password=None)
    except ValueError as exc:
        raise InvalidInput(f"the key files of {name} in {directory} are not PEM private keys") from exc
    if not isinstance(sign, Ed25519PrivateKey) or not isinstance(kem, X25519PrivateKey):
        raise InvalidInput(f"the key files of {name} must hold an Ed25519 and an X25519 key")
    return KeyPair(name, sign, kem)


def load_public(path: Path) -> tuple[str, PublicKeys]:
    """(id, public keys) from a ``<name>.pub.json`` file.

    Raises:
        InvalidInput: unreadable or malformed.
    """
    try:
        raw = json.loads(path.read_text())
        ident, sign, kem = raw["id"], raw["sign_public_key"], raw["kem_public_key"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidInput(f"{path} is not a qoss public key file") from exc
    if not valid_id(ident):
        raise InvalidInput(f"{path}: bad id")
    return ident, PublicKeys.from_text(sign, kem)


class _Crypto:
    """What needs no private key, as the agent's roles take it
    (:class:`app.domain.agent.ports.AgentCrypto`)."""

    __slots__ = ()

    verify = staticmethod(verify)
    public_keys = staticmethod(PublicKeys.from_text)

    @staticmethod
    def read_public(path: Path) -> PublicKeys:
        return load_public(path)[1]


#: The agent's signature checks and public-key reading.
CRYPTO = _Crypto()
