"""POST /v1/tunnels to an unmanaged peer: only the managed gateway is loaded and verified.

The "peer" is the lab's right charon configured directly over VICI, the way its own
administrator would (qoss never talks to it); the tunnel is requested with the peer's
address, identity and write-only PSK.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import httpx
import pytest

from app.adapters.vici.gateway import ViciGateway
from app.domain.algorithms import CATALOGUE
from app.lab.hosts import Lab
from tests.fixtures.secrets import register
from tests.integration.tunnels.conftest import Calls
from tests.integration.tunnels.test_tunnels_api import SUITES, leftovers, make_table, nothing_left, ping

pytestmark = [pytest.mark.anyio, pytest.mark.charon]

PEER_ID = "right.peer"
ADMIN_CONN = "peer-admin"


def _psk() -> str:
    psk = secrets.token_urlsafe(32)
    register(psk)
    return psk


def _configure_peer(lab: Lab, psk: str) -> ViciGateway:
    """What the peer's administrator does: a responder conn accepting a range of proposals."""
    left, right = lab.host("left"), lab.host("right")
    peer = ViciGateway(right.vici_socket, 5.0)
    peer.load_shared(ADMIN_CONN, psk.encode(), [PEER_ID, "left.qoss"])
    peer.load_conn(ADMIN_CONN, {
        "version": "2", "local_addrs": [right.ike_address], "remote_addrs": [left.ike_address],
        "proposals": ["aes128-aes256-sha1-sha256-sha512-modp2048-modp3072-x25519-ecp256",
                      "aes128gcm16-aes256gcm16-chacha20poly1305-prfsha1-prfsha256-prfsha512-modp2048-modp3072-x25519-"
                      "ecp256"],
        "local": {"auth": "psk", "id": PEER_ID}, "remote": {"auth": "psk", "id": "left.qoss"},
        "children": {ADMIN_CONN: {
            "local_ts": [f"{right.inside_address}/32"], "remote_ts": [f"{left.inside_address}/32"],
            "mode": "tunnel", "esp_proposals": ["aes128gcm16-aes256gcm16-chacha20poly1305-modp2048-x25519-noesn",
                                                 "aes128-aes256-sha1-sha256-sha512-modp2048-x25519-noesn"],
        }},
    })
    return peer


@pytest.fixture
def peer_psk(lab: Lab) -> Iterator[str]:
    psk = _psk()
    peer = _configure_peer(lab, psk)
    yield psk
    if any(s.name == ADMIN_CONN for s in peer.list_sas()):
        peer.terminate(ike=ADMIN_CONN, timeout_ms=3000, force=True)
    peer.unload_conn(ADMIN_CONN)
    peer.unload_shared(ADMIN_CONN)


def _body(lab: Lab, psk: str, **extra: object) -> dict[str, object]:
    right = lab.host("right")
    return {"initiator": "left", "remote_ts": [f"{right.inside_address}/32"],
            "peer": {"address": right.ike_address, "identity": PEER_ID, "psk": psk}, **extra}


async def test_peer_tunnel_up_verified_pings_and_deletes_clean(client: httpx.AsyncClient, lab: Lab, calls: Calls,
                                                               peer_psk: str) -> None:
    await make_table(client, "only-aes128gcm16", SUITES["aes128gcm16"])
    r = await client.post("/v1/tunnels", json=_body(lab, peer_psk, rating_table="only-aes128gcm16"))
    assert r.status_code == 201, r.text
    tunnel = r.json()
    assert peer_psk not in r.text
    assert tunnel["responder"] is None
    assert tunnel["peer"] == {"address": lab.host("right").ike_address, "identity": PEER_ID,
                              "local_identity": "left.qoss"}
    assert tunnel["proposals"]["esp"].startswith("aes128gcm16")
    # Only the managed gateway was touched.
    left_socket = lab.host("left").vici_socket
    assert {path for _, path in calls.log} == {left_socket}
    for host in lab.hosts:  # both ends really run the chosen suite
        (sa,) = [s for s in ViciGateway(host.vici_socket, 5.0).list_sas() if s.state == "ESTABLISHED"]
        (child,) = sa.children
        assert child.state == "INSTALLED"
        assert child.encr_alg == CATALOGUE["aes128gcm16"].sa_name
    assert ping(lab).returncode == 0
    shown = (await client.get(f"/v1/tunnels/{tunnel['id']}")).json()
    assert shown["live"]["child_state"] == "INSTALLED"
    assert peer_psk not in str(shown)
    listed = (await client.get("/v1/tunnels")).json()
    assert [t["id"] for t in listed] == [tunnel["id"]]

    assert (await client.delete(f"/v1/tunnels/{tunnel['id']}")).status_code == 204
    left = leftovers(lab)["left"]
    assert left == {"conns": [], "shared": [], "sas": []}, left
    # The peer's own configuration is its administrator's; its SA went with the IKE DELETE.
    assert [s.name for s in ViciGateway(lab.host("right").vici_socket, 5.0).list_sas()] == []


async def test_peer_declared_algorithms_bound_the_choice(client: httpx.AsyncClient, lab: Lab, peer_psk: str) -> None:
    peer = {"address": lab.host("right").ike_address, "identity": PEER_ID, "psk": peer_psk,
            "supports": ["aes256", "sha512", "aes256gcm16", "x25519", "modp2048", "prfsha512", "sha256"]}
    r = await client.post("/v1/tunnels", json={**_body(lab, peer_psk), "peer": peer})
    assert r.status_code == 201, r.text
    suite = r.json()["suite"]
    assert set(filter(None, [suite["encryption"], suite["integrity"], suite["key_exchange"]])) <= set(peer["supports"])
    assert (await client.delete(f"/v1/tunnels/{r.json()['id']}")).status_code == 204


async def test_wrong_peer_psk_is_502_and_leaves_nothing_on_the_gateway(client: httpx.AsyncClient, lab: Lab,
                                                                       peer_psk: str) -> None:
    wrong = _psk()
    r = await client.post("/v1/tunnels", json=_body(lab, wrong))
    assert r.status_code == 502, r.text
    assert r.json()["error"] == "GatewayRejected"
    assert wrong not in r.text
    assert peer_psk not in r.text
    assert leftovers(lab)["left"] == {"conns": [], "shared": [], "sas": []}
    assert (await client.get("/v1/tunnels")).json() == []


async def test_peer_tunnel_requests_that_are_refused_before_any_load(client: httpx.AsyncClient, lab: Lab,
                                                                     calls: Calls) -> None:
    psk = _psk()
    right = lab.host("right")
    cases = [
        # both far ends, or neither
        ({**_body(lab, psk), "responder": "right"}, 422),
        ({"initiator": "left", "remote_ts": ["10.2.0.1/32"]}, 422),
        # a peer needs its networks
        ({"initiator": "left", "peer": {"address": right.ike_address, "psk": psk}}, 422),
        # a short PSK, an unknown field in peer, a non-address
        ({**_body(lab, "too-short-" + psk[:8])}, 422),
        ({**_body(lab, psk), "peer": {"address": right.ike_address, "psk": psk, "cert": "x"}}, 422),
        ({**_body(lab, psk), "peer": {"address": "right.example", "psk": psk}}, 422),
        # outside the allowed networks (TEST-NET-2; never contacted)
        ({**_body(lab, psk), "peer": {"address": "198.51.100.7", "psk": psk}}, 422),
        # the gateway's own address
        ({**_body(lab, psk), "peer": {"address": lab.host("left").ike_address, "psk": psk}}, 422),
    ]
    for body, status in cases:
        r = await client.post("/v1/tunnels", json=body)
        assert r.status_code == status, (body, r.text)
        assert psk not in r.text
    assert calls.log == []
    assert nothing_left(lab), leftovers(lab)


async def test_second_tunnel_with_the_same_peer_identities_is_409(client: httpx.AsyncClient, lab: Lab,
                                                                  peer_psk: str) -> None:
    r = await client.post("/v1/tunnels", json=_body(lab, peer_psk))
    assert r.status_code == 201, r.text
    again = await client.post("/v1/tunnels", json=_body(lab, peer_psk))
    assert again.status_code == 409, again.text
    assert r.json()["id"] in again.json()["detail"]
    assert (await client.delete(f"/v1/tunnels/{r.json()['id']}")).status_code == 204


async def test_reconcile_marks_a_lost_peer_tunnel_failed(client: httpx.AsyncClient, lab: Lab, peer_psk: str) -> None:
    r = await client.post("/v1/tunnels", json=_body(lab, peer_psk))
    assert r.status_code == 201, r.text
    tunnel = r.json()
    left = ViciGateway(lab.host("left").vici_socket, 5.0)
    left.terminate(ike=tunnel["conn"], timeout_ms=3000, force=True)  # e.g. charon restarted: SA gone
    report = (await client.post("/v1/tunnels/reconcile")).json()
    assert tunnel["id"] in report["failed"]
    assert "PSK is not kept" in report["failed"][tunnel["id"]]
    shown = (await client.get(f"/v1/tunnels/{tunnel['id']}")).json()
    assert shown["state"] == "failed"
    assert leftovers(lab)["left"] == {"conns": [], "shared": [], "sas": []}
    assert (await client.delete(f"/v1/tunnels/{tunnel['id']}")).status_code == 204
