"""A responder's load that its initiator never confirms ends by itself, even when the responder's
qoss is killed outright (SIGKILL) between its load and the initiator's initiate: the detached
janitor beside ``qoss serve`` unloads it at the offer's expiry."""

from __future__ import annotations

import contextlib
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.adapters.agent.crypto import KeyPair, PublicKeys
from app.domain.agent import Kind, canonical
from app.domain.peering import PENDING_FOR
from tests.integration.charon.conftest import temporary_lab
from tests.integration.tunnels.test_peered import Site, _conns, _site


@pytest.fixture
def site_b(tmp_path: Path) -> Iterator[tuple[Site, str, str]]:
    with temporary_lab("px") as lab, contextlib.ExitStack() as stack:
        b = _site(stack, lab, tmp_path / "b", "site-b", lab.host("right"), "gw-b")
        left = lab.host("left")
        yield b, left.ike_address, left.inside_address


def test_a_load_never_confirmed_is_gone_after_the_responders_qoss_is_killed(site_b: tuple[Site, str, str]) -> None:
    b, initiator_address, initiator_inside = site_b
    keys = KeyPair.generate("site-t")  # this test plays the initiating qoss
    with b.client() as c:
        r = c.post("/v1/peers", json={"name": "site-t", "url": "http://127.0.0.1:9", **keys.public.as_dict(),
                                      "gateways": ["gw-b"], "networks": [f"{b.host.inside_address}/32"]})
        assert r.status_code == 201, r.text
        identity = c.get("/v1/peering/identity").json()
    tunnel_id = secrets.token_hex(6)
    offer = {"tunnel_id": tunnel_id, "sender": "site-t", "timestamp": int(time.time()),
             "nonce": secrets.token_urlsafe(18), "gateway": "gw-b",
             "initiator": {"address": initiator_address, "identity": f"{tunnel_id}.gw-t",
                           "networks": [f"{initiator_inside}/32"]},
             "networks": [], "min_levels": {"confidentiality": 5}, "suites": ["aes128gcm16-x25519"],
             "ikes": ["aes128gcm16-prfsha256-x25519"], "mode": "tunnel", "lifetimes": [3600, 1200]}
    kem = PublicKeys.from_text(identity["sign_public_key"], identity["kem_public_key"]).kem
    wire = keys.seal(kind=Kind.PEER_OFFER, to="site-b", body=canonical(offer), recipient=kem)
    answer = httpx.post(f"{b.base}/v1/peering/messages", content=wire, headers={"content-type": "application/json"},
                        timeout=30)
    assert answer.status_code == 200, answer.text
    conn = f"qoss-{tunnel_id}"
    assert conn in _conns(b)  # loaded as responder, waiting for a confirm that never comes
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait(timeout=10)
    deadline = time.monotonic() + PENDING_FOR + 10
    while conn in _conns(b) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert conn not in _conns(b)
