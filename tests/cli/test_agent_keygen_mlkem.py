"""``qoss agent keygen`` makes an ML-KEM-768 key beside the Ed25519 and X25519 ones, and
``--add-mlkem`` gives keys made without one an ML-KEM-768 key, keeping the others."""

from __future__ import annotations

import json
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from app.adapters.agent.crypto import KeyPair, load_keys, load_public, write_keys
from tests.cli.run import qoss


def test_keygen_makes_an_mlkem_key_and_publishes_it(tmp_path: Path) -> None:
    done = qoss("agent", "keygen", "gil", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert len(shown["mlkem_public_key"]) == 1579  # 1,184 bytes in unpadded base64url
    assert (tmp_path / "gil.mlkem768").stat().st_mode & 0o777 == 0o600
    assert load_public(tmp_path / "gil.pub.json")[1] == load_keys(tmp_path, "gil").public


def test_add_mlkem_keeps_the_old_keys_and_refuses_keys_that_have_one(tmp_path: Path) -> None:
    write_keys(KeyPair("hal", Ed25519PrivateKey.generate(), X25519PrivateKey.generate()), tmp_path)
    before = load_public(tmp_path / "hal.pub.json")[1]
    done = qoss("agent", "keygen", "hal", "--dir", str(tmp_path), "--add-mlkem")
    assert done.returncode == 0, done.stderr
    after = load_public(tmp_path / "hal.pub.json")[1]
    assert (after.sign, after.kem) == (before.sign, before.kem)
    assert after.mlkem is not None
    again = qoss("agent", "keygen", "hal", "--dir", str(tmp_path), "--add-mlkem")
    assert again.returncode == 2
    assert "have an ML-KEM-768 key already" in again.stderr
    assert load_public(tmp_path / "hal.pub.json")[1] == after
