"""The hybrid seal of the agent's (and peers') messages: X-Wing (ML-KEM-768 + X25519) as HPKE's KEM.

The combiner is checked against the X-Wing draft's published vectors, and a sealed message is
opened here by an independent reading of the published construction (X-Wing's combiner, then
RFC 9180's key schedule for KEM 0x647a, HKDF-SHA256, ChaCha20-Poly1305), so the seal is the
construction the docs name and nothing of our own. Then: what the X25519 half alone cannot do,
downgrades that do not open, the refusal to seal a post-quantum preshared key classically, and
key files with and without an ML-KEM-768 key."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.mlkem import MLKEM768PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from app.adapters.agent.crypto import KeyPair, load_keys, load_public, write_keys
from app.domain.agent import (
    ENVELOPE_INFO,
    MAX_WIRE_BYTES,
    AgentRejected,
    Kind,
    NoPostQuantumKey,
    b64e,
    canonical,
    decode_canonical,
    open_plaintext,
)
from app.domain.errors import InvalidInput

VECTORS = json.loads((Path(__file__).parents[2] / "fixtures" / "xwing_vectors.json").read_text())["vectors"]
XWING_LABEL = bytes.fromhex("5c2e2f2f5e5c")  # \./ /^\
#: RFC 9180 suite id: KEM MLKEM768-X25519 (0x647a), KDF HKDF-SHA256 (0x0001), AEAD ChaCha20-Poly1305 (0x0003).
SUITE_ID = b"HPKE" + bytes.fromhex("647a") + bytes.fromhex("0001") + bytes.fromhex("0003")
ENC = 1120  # ML-KEM-768 ciphertext (1,088) || X25519 ephemeral public key (32)


def combiner(ss_m: bytes, ss_x: bytes, ct_x: bytes, pk_x: bytes) -> bytes:
    """X-Wing's combiner: SHA3-256(ss_M || ss_X || ct_X || pk_X || label)."""
    return hashlib.sha3_256(ss_m + ss_x + ct_x + pk_x + XWING_LABEL).digest()


def expand_seed(seed: bytes) -> tuple[MLKEM768PrivateKey, X25519PrivateKey]:
    """X-Wing's decapsulation key from its 32-byte seed: SHAKE256 to 96 bytes, ML-KEM's d||z and X25519's key."""
    expanded = hashlib.shake_256(seed).digest(96)
    return MLKEM768PrivateKey.from_seed_bytes(expanded[:64]), X25519PrivateKey.from_private_bytes(expanded[64:])


def hpke_open(shared_secret: bytes, sealed_ct: bytes, info: bytes) -> bytes:
    """RFC 9180 base mode, single shot: the key schedule from ``shared_secret`` and ``info``, then the AEAD."""
    def extract(salt: bytes, label: bytes, ikm: bytes) -> bytes:
        return hmac.new(salt, b"HPKE-v1" + SUITE_ID + label + ikm, hashlib.sha256).digest()

    def expand(prk: bytes, label: bytes, ctx: bytes, n: int) -> bytes:
        return hmac.new(prk, n.to_bytes(2, "big") + b"HPKE-v1" + SUITE_ID + label + ctx + b"\x01",
                        hashlib.sha256).digest()[:n]

    context = b"\x00" + extract(b"", b"psk_id_hash", b"") + extract(b"", b"info_hash", info)
    secret = extract(shared_secret, b"secret", b"")
    return ChaCha20Poly1305(expand(secret, b"key", context, 32)).decrypt(
        expand(secret, b"base_nonce", context, 12), sealed_ct, b"")


def wire_parts(data: bytes) -> tuple[dict[str, object], bytes]:
    obj = decode_canonical(data, max_size=MAX_WIRE_BYTES)
    sealed = str(obj["sealed"])
    return obj, base64.urlsafe_b64decode(sealed + "=" * (-len(sealed) % 4))


def rewire(obj: dict[str, object], sealed: bytes, **header: object) -> bytes:
    return canonical({**obj, **header, "sealed": b64e(sealed)})


def info_of(obj: dict[str, object]) -> bytes:
    return ENVELOPE_INFO + canonical({k: v for k, v in obj.items() if k != "sealed"})


class Party:
    """A key pair whose component private keys the test holds (as a recording would)."""

    def __init__(self, name: str) -> None:
        self.x25519 = X25519PrivateKey.generate()
        self.mlkem = MLKEM768PrivateKey.generate()
        self.keys = KeyPair(name, Ed25519PrivateKey.generate(), self.x25519, self.mlkem)


ALICE, HQ = Party("alice"), Party("hq")


def sealed_to_hq(body: bytes = b'{"secret":"s3cr3t"}', kind: Kind = Kind.CONNECT) -> bytes:
    public = HQ.keys.public
    return ALICE.keys.seal(kind=kind, to="hq", body=body, recipient=public.kem, recipient_mlkem=public.mlkem)


# --------------------------------------------------------------------------- the construction


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v["sk"][:8])
def test_the_combiner_of_xwing_decapsulates_its_published_vectors(vector: dict[str, str]) -> None:
    mlkem, x25519 = expand_seed(bytes.fromhex(vector["sk"]))
    pk_x = x25519.public_key().public_bytes_raw()
    assert mlkem.public_key().public_bytes_raw() + pk_x == bytes.fromhex(vector["pk"])
    ct = bytes.fromhex(vector["ct"])
    ss_m = mlkem.decapsulate(ct[:1088])
    ss_x = x25519.exchange(X25519PublicKey.from_public_bytes(ct[1088:]))
    assert combiner(ss_m, ss_x, ct[1088:], pk_x) == bytes.fromhex(vector["ss"])


def test_a_hybrid_seal_is_hpke_with_xwing_as_published() -> None:
    obj, sealed = wire_parts(sealed_to_hq())
    assert obj["v"] == 2
    enc, ct = sealed[:ENC], sealed[ENC:]
    pk_x = HQ.x25519.public_key().public_bytes_raw()
    ss = combiner(HQ.mlkem.decapsulate(enc[:1088]),
                  HQ.x25519.exchange(X25519PublicKey.from_public_bytes(enc[1088:])), enc[1088:], pk_x)
    body, tag = open_plaintext(hpke_open(ss, ct, info_of(obj)))
    assert body == b'{"secret":"s3cr3t"}'
    assert len(tag) == 64


def test_the_x25519_half_alone_does_not_open_a_hybrid_seal() -> None:
    obj, sealed = wire_parts(sealed_to_hq())
    enc, ct = sealed[:ENC], sealed[ENC:]
    pk_x = HQ.x25519.public_key().public_bytes_raw()
    ss_x = HQ.x25519.exchange(X25519PublicKey.from_public_bytes(enc[1088:]))  # all the X25519 key gives
    for guess in (bytes(32), ss_x, hashlib.sha256(ss_x).digest()):  # no ML-KEM shared secret to put beside it
        with pytest.raises(InvalidTag):
            hpke_open(combiner(guess, ss_x, enc[1088:], pk_x), ct, info_of(obj))
    # Nor with any other ML-KEM-768 key beside the right X25519 key (ML-KEM rejects implicitly).
    suite = hpke.Suite(hpke.KEM.MLKEM768_X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
    with pytest.raises(InvalidTag):
        suite.decrypt(sealed, hpke.MLKEM768X25519PrivateKey(MLKEM768PrivateKey.generate(), HQ.x25519),
                      info=info_of(obj))
    with pytest.raises(AgentRejected):
        KeyPair("hq", Ed25519PrivateKey.generate(), HQ.x25519, MLKEM768PrivateKey.generate()).open_sealed(
            rewire(obj, sealed), kinds=[Kind.CONNECT])
    with pytest.raises(AgentRejected):  # and the X25519 key alone refuses it outright
        KeyPair("hq", Ed25519PrivateKey.generate(), HQ.x25519).open_sealed(rewire(obj, sealed), kinds=[Kind.CONNECT])


# --------------------------------------------------------------------------- downgrades


def test_a_hybrid_message_relabelled_classic_does_not_open() -> None:
    obj, sealed = wire_parts(sealed_to_hq())
    with pytest.raises(AgentRejected) as info:
        HQ.keys.open_sealed(rewire(obj, sealed, v=1), kinds=[Kind.CONNECT])
    assert info.value.reason == "cannot open the seal"


def test_a_hybrid_message_with_its_mlkem_part_stripped_does_not_open() -> None:
    obj, sealed = wire_parts(sealed_to_hq())
    stripped = sealed[1088:]  # the X25519 ephemeral key and the AEAD ciphertext: a DHKEM-X25519 seal's shape
    for v in (1, 2):
        with pytest.raises(AgentRejected) as info:
            HQ.keys.open_sealed(rewire(obj, stripped, v=v), kinds=[Kind.CONNECT])
        assert info.value.reason == "cannot open the seal"


def test_a_classic_message_relabelled_hybrid_does_not_open() -> None:
    classic = ALICE.keys.seal(kind=Kind.CONNECT, to="hq", body=b"{}", recipient=HQ.keys.public.kem)
    obj, sealed = wire_parts(classic)
    assert obj["v"] == 1
    with pytest.raises(AgentRejected):
        HQ.keys.open_sealed(rewire(obj, sealed, v=2), kinds=[Kind.CONNECT])


def test_an_unknown_version_is_refused_before_any_decryption() -> None:
    obj, sealed = wire_parts(sealed_to_hq())
    with pytest.raises(AgentRejected) as info:
        HQ.keys.open_sealed(rewire(obj, sealed, v=3), kinds=[Kind.CONNECT])
    assert info.value.reason == "unknown version"


def test_a_receiver_that_needs_hybrid_refuses_a_classic_message() -> None:
    classic = ALICE.keys.seal(kind=Kind.RESPONSE, to="hq", body=b"{}", recipient=HQ.keys.public.kem)
    with pytest.raises(AgentRejected) as info:
        HQ.keys.open_sealed(classic, kinds=[Kind.RESPONSE], hybrid_only=True)
    assert info.value.reason.startswith("sealed with X25519 alone")
    kind, body, _ = HQ.keys.open_sealed(sealed_to_hq(kind=Kind.RESPONSE), kinds=[Kind.RESPONSE], hybrid_only=True)
    assert (kind, body) == (Kind.RESPONSE, b'{"secret":"s3cr3t"}')


def test_a_post_quantum_preshared_key_is_never_sealed_classically() -> None:
    old = KeyPair("old", Ed25519PrivateKey.generate(), X25519PrivateKey.generate())
    with pytest.raises(NoPostQuantumKey) as info:
        ALICE.keys.seal(kind=Kind.RESPONSE, to="old", body=b"{}", recipient=old.public.kem, post_quantum=True)
    assert "old has no ML-KEM-768 public key" in info.value.message
    assert "command line" in info.value.message
    wire = ALICE.keys.seal(kind=Kind.RESPONSE, to="hq", body=b"{}", recipient=HQ.keys.public.kem,
                           recipient_mlkem=HQ.keys.public.mlkem, post_quantum=True)
    assert wire_parts(wire)[0]["v"] == 2


def test_the_sealed_plaintext_is_the_same_in_either_mode() -> None:
    """Only the KEM differs: the signed body and its tag are sealed alike."""
    assert HQ.keys.open_sealed(sealed_to_hq(), kinds=[Kind.CONNECT])[1:] == HQ.keys.open_sealed(
        ALICE.keys.seal(kind=Kind.CONNECT, to="hq", body=b'{"secret":"s3cr3t"}', recipient=HQ.keys.public.kem),
        kinds=[Kind.CONNECT])[1:]


# --------------------------------------------------------------------------- keys


def test_keygen_writes_an_mlkem_key_beside_the_others(tmp_path: Path) -> None:
    keys = KeyPair.generate("bob")
    pub = write_keys(keys, tmp_path)
    assert (tmp_path / "bob.mlkem768").stat().st_mode & 0o777 == 0o600
    ident, public = load_public(pub)
    assert (ident, public) == ("bob", keys.public)
    assert public.mlkem is not None
    assert len(public.mlkem) == 1184
    again = load_keys(tmp_path, "bob")
    wire = ALICE.keys.seal(kind=Kind.CONNECT, to="bob", body=b"{}", recipient=public.kem, recipient_mlkem=public.mlkem)
    assert again.open_sealed(wire, kinds=[Kind.CONNECT])[1] == b"{}"


def test_key_files_without_an_mlkem_key_keep_working_for_classic_messages(tmp_path: Path) -> None:
    old = KeyPair("carol", Ed25519PrivateKey.generate(), X25519PrivateKey.generate())
    pub = write_keys(old, tmp_path)
    assert not (tmp_path / "carol.mlkem768").exists()
    assert "mlkem_public_key" not in json.loads(pub.read_text())
    _, public = load_public(pub)
    assert public.mlkem is None
    loaded = load_keys(tmp_path, "carol")
    wire = ALICE.keys.seal(kind=Kind.CONNECT, to="carol", body=b"{}", recipient=public.kem,
                           recipient_mlkem=public.mlkem)
    assert loaded.open_sealed(wire, kinds=[Kind.CONNECT])[1] == b"{}"
    hybrid = ALICE.keys.seal(kind=Kind.CONNECT, to="carol", body=b"{}", recipient=public.kem,
                             recipient_mlkem=HQ.keys.public.mlkem)
    with pytest.raises(AgentRejected) as info:  # a hybrid seal it cannot open says why, in the audit reason
        loaded.open_sealed(hybrid, kinds=[Kind.CONNECT])
    assert "no ML-KEM-768 key" in info.value.reason


def test_an_mlkem_key_is_added_to_old_keys_and_the_old_ones_stay(tmp_path: Path) -> None:
    write_keys(KeyPair("dan", Ed25519PrivateKey.generate(), X25519PrivateKey.generate()), tmp_path)
    before = load_keys(tmp_path, "dan").public
    write_keys(load_keys(tmp_path, "dan").with_mlkem(), tmp_path, overwrite=True)
    after = load_public(tmp_path / "dan.pub.json")[1]
    assert (after.sign, after.kem) == (before.sign, before.kem)
    assert after.mlkem is not None


def test_a_readable_mlkem_key_file_is_refused(tmp_path: Path) -> None:
    write_keys(KeyPair.generate("erin"), tmp_path)
    os.chmod(tmp_path / "erin.mlkem768", 0o644)
    with pytest.raises(InvalidInput, match="may be read by others"):
        load_keys(tmp_path, "erin")


def test_a_bad_mlkem_public_key_is_refused(tmp_path: Path) -> None:
    pub = write_keys(KeyPair.generate("fay"), tmp_path)
    doc = json.loads(pub.read_text())
    doc["mlkem_public_key"] = doc["mlkem_public_key"][:-8]
    pub.write_text(json.dumps(doc))
    with pytest.raises(InvalidInput, match="ML-KEM-768"):
        load_public(pub)
