"""Keys, signatures and seals of the tunnel agent (and of peers, who use the same).

Every party has an Ed25519 key to sign, a separate X25519 key to be sealed to and, beside
it, an ML-KEM-768 key (FIPS 203). A message is signed (Ed25519 over a context label, its
kind and its canonical body) and then sealed with HPKE (RFC 9180, base mode, HKDF-SHA256,
ChaCha20-Poly1305) to the recipient:

- *hybrid* (wire version 2) when the recipient has an ML-KEM-768 key: HPKE's KEM is X-Wing
  (draft-connolly-cfrg-xwing-kem; "MLKEM768-X25519", KEM id 0x647a, in draft-ietf-hpke-pq):
  the sender encapsulates to both the recipient's ML-KEM-768 key and its X25519 key, and the
  shared secret is SHA3-256 over both shared secrets, the X25519 ciphertext and the X25519
  public key (the ML-KEM ciphertext is bound by ML-KEM itself). A recorded message stays
  closed unless both X25519 and ML-KEM-768 are broken;
- *classic* (wire version 1), DHKEM-X25519, for a recipient whose keys have no ML-KEM-768 key.
  A message that carries a post-quantum preshared key is never sealed so
  (:class:`~app.domain.agent.NoPostQuantumKey`).

The cleartext header, its version (the mode) included, is the HPKE ``info`` (with a context
label), so it cannot be altered either: a hybrid message relabelled classic, or with its ML-KEM
ciphertext stripped, does not open. Base mode is anonymous, hence the signature inside.
``cryptography``'s HPKE has no separate AAD argument; the header in ``info`` binds it just as
well (any change gives a different key schedule).

Private keys live in files of mode 0600 and are refused when anyone else may read them; key
files made before ML-KEM keys existed (no ``<name>.mlkem768``) still load and are sealed to
classically, which is enough for every message that carries no post-quantum preshared key.
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
from cryptography.hazmat.primitives.asymmetric.mlkem import MLKEM768PrivateKey, MLKEM768PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from app.domain.agent import (
    MLKEM_PUBLIC_BYTES,
    AgentRejected,
    Kind,
    NoPostQuantumKey,
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
    "mlkem_public",
    "open_sealed",
    "seal",
    "verify",
    "write_keys",
]

_SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
#: The hybrid seal: X-Wing (ML-KEM-768 + X25519) as HPKE's KEM, the same KDF and AEAD.
_HYBRID = hpke.Suite(hpke.KEM.MLKEM768_X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)


@functools.lru_cache(maxsize=1024)
def _kem_public(raw: bytes) -> X25519PublicKey:
    """A peer's X25519 key object, parsed once (public keys only: nothing secret is cached)."""
    return X25519PublicKey.from_public_bytes(raw)


@functools.lru_cache(maxsize=1024)
def _hybrid_public(mlkem: bytes, x25519: bytes) -> hpke.MLKEM768X25519PublicKey:
    """A peer's X-Wing key (its ML-KEM-768 and X25519 keys), parsed once."""
    return hpke.MLKEM768X25519PublicKey(MLKEM768PublicKey.from_public_bytes(mlkem), _kem_public(x25519))


@functools.lru_cache(maxsize=1024)
def _sign_public(raw: bytes) -> Ed25519PublicKey:
    """A peer's Ed25519 key object, parsed once."""
    return Ed25519PublicKey.from_public_bytes(raw)


@dataclass(frozen=True, slots=True)
class PublicKeys:
    """A party's public keys: Ed25519 to verify and X25519 to seal to (32 bytes each), and its
    ML-KEM-768 key (1,184 bytes; None for keys made before ML-KEM keys existed)."""

    sign: bytes
    kem: bytes
    mlkem: bytes | None = None

    def as_dict(self) -> dict[str, str]:
        """As key files and identities carry them (``mlkem_public_key`` only when there is one)."""
        out = {"sign_public_key": b64e(self.sign), "kem_public_key": b64e(self.kem)}
        if self.mlkem is not None:
            out["mlkem_public_key"] = b64e(self.mlkem)
        return out

    @classmethod
    def from_text(cls, sign: str, kem: str, mlkem: str | None = None) -> PublicKeys:
        """From unpadded base64url text.

        Raises:
            InvalidInput: not 32-byte keys (1,184 bytes for ML-KEM-768) in base64url.
        """
        try:
            keys = cls(b64d(sign, size=32), b64d(kem, size=32))
            X25519PublicKey.from_public_bytes(keys.kem)
            Ed25519PublicKey.from_public_bytes(keys.sign)
        except (AgentRejected, ValueError) as exc:
            raise InvalidInput("a public key is 32 bytes in unpadded base64url") from exc
        if mlkem is None:
            return keys
        return cls(keys.sign, keys.kem, mlkem_public(mlkem))


def mlkem_public(text: str) -> bytes:
    """An ML-KEM-768 public key from unpadded base64url text (its 1,184 bytes, checked to parse).

    Raises:
        InvalidInput: not an ML-KEM-768 public key.
    """
    try:
        raw = b64d(text, size=MLKEM_PUBLIC_BYTES)
        MLKEM768PublicKey.from_public_bytes(raw)
    except (AgentRejected, ValueError) as exc:
        raise InvalidInput(f"mlkem_public_key is an ML-KEM-768 public key: {MLKEM_PUBLIC_BYTES} bytes "
                           "in unpadded base64url") from exc
    return raw


class KeyPair:
    """A party's private keys. Never printed, never serialised except to its key files."""

    __slots__ = ("_hybrid", "_kem", "_mlkem", "_sign", "name")

    def __init__(self, name: str, sign: Ed25519PrivateKey, kem: X25519PrivateKey,
                 mlkem: MLKEM768PrivateKey | None = None) -> None:
        self.name = name
        self._sign = sign
        self._kem = kem
        self._mlkem = mlkem
        self._hybrid = hpke.MLKEM768X25519PrivateKey(mlkem, kem) if mlkem is not None else None

    @classmethod
    def generate(cls, name: str) -> KeyPair:
        """New Ed25519, X25519 and ML-KEM-768 keys named ``name``."""
        if not valid_id(name):
            raise InvalidInput("a key name is 1-63 of a-z, 0-9, '.', '_', '-'")
        return cls(name, Ed25519PrivateKey.generate(), X25519PrivateKey.generate(), MLKEM768PrivateKey.generate())

    def with_mlkem(self) -> KeyPair:
        """These keys and a new ML-KEM-768 key beside them (keys made before ML-KEM keys existed)."""
        return KeyPair(self.name, self._sign, self._kem, MLKEM768PrivateKey.generate())

    def __repr__(self) -> str:
        return f"KeyPair({self.name!r})"

    @property
    def public(self) -> PublicKeys:
        raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
        return PublicKeys(self._sign.public_key().public_bytes(*raw), self._kem.public_key().public_bytes(*raw),
                          self._mlkem.public_key().public_bytes_raw() if self._mlkem is not None else None)

    def sign(self, kind: Kind, body: bytes) -> bytes:
        return self._sign.sign(signed_bytes(kind, body))

    def decrypt(self, wire: Wire) -> bytes:
        """Open ``wire``'s seal: hybrid or classic, as its (bound) header says.

        Raises:
            AgentRejected: it does not open, or it is hybrid and these keys have no ML-KEM-768 key.
        """
        if wire.hybrid and self._hybrid is None:
            raise AgentRejected("sealed with ML-KEM-768 and X25519, and these keys have no ML-KEM-768 key")
        try:
            if self._hybrid is not None and wire.hybrid:
                return _HYBRID.decrypt(wire.sealed, self._hybrid, info=wire.info())
            return _SUITE.decrypt(wire.sealed, self._kem, info=wire.info())
        except (InvalidTag, ValueError) as exc:
            raise AgentRejected("cannot open the seal") from exc

    def seal(self, *, kind: Kind, to: str, body: bytes, recipient: bytes, recipient_mlkem: bytes | None = None,
             post_quantum: bool = False) -> bytes:
        """:func:`seal`, signed by these keys."""
        return seal(kind=kind, to=to, body=body, signer=self, recipient=recipient, recipient_mlkem=recipient_mlkem,
                    post_quantum=post_quantum)

    def open_sealed(self, data: bytes, *, kinds: Sequence[Kind], hybrid_only: bool = False
                    ) -> tuple[Kind, bytes, bytes]:
        """:func:`open_sealed` with these keys."""
        return open_sealed(data, kinds=kinds, me=self, hybrid_only=hybrid_only)

    def private_pem(self) -> tuple[bytes, bytes]:
        """The Ed25519 and X25519 keys in PEM (PKCS#8)."""
        enc = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        return self._sign.private_bytes(*enc), self._kem.private_bytes(*enc)

    def mlkem_pem(self) -> bytes | None:
        """The ML-KEM-768 key in PEM (PKCS#8, its seed), or None."""
        if self._mlkem is None:
            return None
        enc = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        return self._mlkem.private_bytes(*enc)


def seal(*, kind: Kind, to: str, body: bytes, signer: KeyPair, recipient: bytes, recipient_mlkem: bytes | None = None,
         post_quantum: bool = False) -> bytes:
    """Sign ``body`` as ``signer`` and seal body+signature to the recipient; the wire bytes.

    Sealed hybrid (X-Wing: ``recipient_mlkem``, its ML-KEM-768 key, and ``recipient``, its X25519
    key) when the recipient has an ML-KEM-768 key, else classic (X25519 alone).

    Raises:
        NoPostQuantumKey: ``post_quantum`` (the message carries a post-quantum preshared key) and
            the recipient has no ML-KEM-768 key: such a message is only ever sealed hybrid.
        AgentRejected: a recipient key is not a key of its kind.
    """
    if post_quantum and recipient_mlkem is None:
        raise NoPostQuantumKey(to)
    header = Wire(kind=kind, to=to, sealed=b"", hybrid=recipient_mlkem is not None)
    plaintext = seal_plaintext(body, signer.sign(kind, body))
    try:
        if recipient_mlkem is not None:
            sealed = _HYBRID.encrypt(plaintext, _hybrid_public(recipient_mlkem, recipient), info=header.info())
        else:
            sealed = _SUITE.encrypt(plaintext, _kem_public(recipient), info=header.info())
    except ValueError as exc:
        raise AgentRejected("not an X25519 (or ML-KEM-768) public key") from exc
    return Wire(kind=kind, to=to, sealed=sealed, hybrid=header.hybrid).encode()


def open_sealed(data: bytes, *, kinds: Sequence[Kind], me: KeyPair, hybrid_only: bool = False
                ) -> tuple[Kind, bytes, bytes]:
    """Check the header, open the seal with ``me``'s key: (kind, signed body, tag). Not yet verified.

    ``hybrid_only``: refuse a message sealed with X25519 alone (a receiver expecting a
    post-quantum preshared key in it).

    Raises:
        AgentRejected: too large, malformed, not for ``me``, classic where ``hybrid_only``, or the
            seal does not open.
    """
    wire = parse_wire(data, kinds=kinds, to=me.name)
    if hybrid_only and not wire.hybrid:
        raise AgentRejected("sealed with X25519 alone where ML-KEM-768 and X25519 are required")
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


def _mlkem_path(directory: Path, name: str) -> Path:
    return directory / f"{name}.mlkem768"


def write_keys(keys: KeyPair, directory: Path, *, overwrite: bool = False) -> Path:
    """Write ``<name>.ed25519``, ``<name>.x25519`` and ``<name>.mlkem768`` (0600) and
    ``<name>.pub.json``; the public file's path.

    Raises:
        InvalidInput: the files exist already (and ``overwrite`` is false).
    """
    directory.mkdir(parents=True, exist_ok=True)
    sign_path, kem_path, pub_path = _paths(directory, keys.name)
    mlkem_path = _mlkem_path(directory, keys.name)
    if not overwrite and any(p.exists() for p in (sign_path, kem_path, mlkem_path, pub_path)):
        raise InvalidInput(f"keys for {keys.name} exist already in {directory}")
    private = [*zip((sign_path, kem_path), keys.private_pem(), strict=True)]
    mlkem_pem = keys.mlkem_pem()
    if mlkem_pem is not None:
        private.append((mlkem_path, mlkem_pem))
    elif overwrite:  # keys without one replace keys with one: no stale ML-KEM key beside them
        mlkem_path.unlink(missing_ok=True)
    for path, pem in private:
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
    """Load ``name``'s private keys from ``directory`` (its ML-KEM-768 key if it has one).

    Raises:
        InvalidInput: missing, unreadable, readable by others, or not the right kind of key.
    """
    sign_path, kem_path, _ = _paths(directory, name)
    mlkem_path = _mlkem_path(directory, name)
    pems = [_read_private(sign_path), _read_private(kem_path),
            *((_read_private(mlkem_path),) if mlkem_path.exists() else ())]
    try:
        sign, kem, *more = (serialization.load_pem_private_key(pem, password=None) for pem in pems)
        mlkem = more[0] if more else None
    except ValueError as exc:
        raise InvalidInput(f"the key files of {name} in {directory} are not PEM private keys") from exc
    if not isinstance(sign, Ed25519PrivateKey) or not isinstance(kem, X25519PrivateKey):
        raise InvalidInput(f"the key files of {name} must hold an Ed25519 and an X25519 key")
    if mlkem is not None and not isinstance(mlkem, MLKEM768PrivateKey):
        raise InvalidInput(f"{mlkem_path} must hold an ML-KEM-768 key")
    return KeyPair(name, sign, kem, mlkem)


def load_public(path: Path) -> tuple[str, PublicKeys]:
    """(id, public keys) from a ``<name>.pub.json`` file.

    Raises:
        InvalidInput: unreadable or malformed.
    """
    try:
        raw = json.loads(path.read_text())
        ident, sign, kem = raw["id"], raw["sign_public_key"], raw["kem_public_key"]
        mlkem = raw.get("mlkem_public_key")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidInput(f"{path} is not a qoss public key file") from exc
    if not valid_id(ident):
        raise InvalidInput(f"{path}: bad id")
    return ident, PublicKeys.from_text(sign, kem, mlkem)


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
