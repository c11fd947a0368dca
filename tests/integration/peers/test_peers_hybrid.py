"""Between real processes in the peers lab: each site registered the other with the ML-KEM-768 key
its identity publishes, so their messages are sealed hybrid (ML-KEM-768 + X25519), and a tunnel
asked at site A still comes up on both charons through that hybrid offer and answer."""

from __future__ import annotations

import subprocess
from typing import Any

import httpx

from app.adapters.agent.crypto import PublicKeys


def _api(site: dict[str, Any]) -> httpx.Client:
    return httpx.Client(base_url=site["url"], headers={"Authorization": f"Bearer {site['token']}"}, timeout=30,
                        trust_env=False)


def test_each_site_seals_to_the_other_with_the_mlkem_key_its_identity_publishes(peers_lab: dict[str, Any]) -> None:
    sites = peers_lab["sites"]
    for name, site in sites.items():
        (other,) = [s for n, s in sites.items() if n != name]
        with _api(other) as c:
            identity = c.get("/v1/peering/identity").json()
        keys = PublicKeys.from_text(identity["sign_public_key"], identity["kem_public_key"],
                                    identity["mlkem_public_key"])
        assert keys.mlkem is not None
        with _api(site) as c:
            (peer,) = c.get("/v1/peers").json()
        assert peer["mlkem_public_key"] == identity["mlkem_public_key"]


def test_a_tunnel_comes_up_through_the_hybrid_offer_and_answer(peers_lab: dict[str, Any]) -> None:
    a, b = peers_lab["sites"]["site-a"], peers_lab["sites"]["site-b"]
    with _api(a) as c:
        r = c.post("/v1/tunnels", json={"initiator": a["gateway"], "responder": f"{b['gateway']}@site-b",
                                        "min_levels": {"confidentiality": 5}})
        assert r.status_code == 201, r.text
        tunnel = r.json()
        try:
            listing = subprocess.run(["swanctl", "--list-sas", "--uri", f"unix://{b['vici']}"], capture_output=True,
                                     text=True, timeout=20, check=True).stdout
            assert f"{tunnel['conn']}: #" in listing, listing
        finally:
            assert c.delete(f"/v1/tunnels/{tunnel['id']}").status_code == 204
