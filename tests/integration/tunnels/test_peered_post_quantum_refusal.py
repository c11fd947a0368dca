"""A peer registered without an ML-KEM-768 key gets no post-quantum preshared key: a tunnel with it
and a post-quantum minimum is refused before anything is sent or loaded, saying why."""

from __future__ import annotations

from tests.integration.tunnels.test_peered import Site, _conns, _sas, sites

__all__ = ["sites"]  # the module's lab: two qoss serve processes that registered each other without ML-KEM keys


def test_a_post_quantum_minimum_with_a_peer_without_an_mlkem_key_is_refused(sites: tuple[Site, Site]) -> None:
    a, b = sites
    with a.client() as c:
        r = c.post("/v1/tunnels", json={"initiator": "gw-a", "responder": "gw-b@site-b",
                                        "min_levels": {"confidentiality": 5, "post_quantum": 5}})
        assert r.status_code == 409, r.text
        assert r.json()["error"] == "UnsupportedProtection"
        assert "site-b registered no ML-KEM-768 key" in r.json()["detail"]
        assert c.get("/v1/tunnels").json() == []
    with b.client() as c:
        assert c.get("/v1/tunnels").json() == []
    assert _sas(a) == _sas(b) == []
    assert _conns(a) == _conns(b) == []
