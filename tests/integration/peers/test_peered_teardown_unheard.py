"""A teardown the other side did not hear is told again until it does: with site B's qoss down
(killed outright), a DELETE at site A takes A's end down at once and answers 204; B's charon keeps
B's end, since nobody could tell it. Once B's qoss is back (its own database, the same address), A
tells it again and B's end goes from B's charon and B's records; A then keeps nothing more to tell."""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

from tests.fixtures.served import steady_port
from tests.integration.charon.conftest import temporary_lab
from tests.integration.tunnels.test_peered import Site, _conns, _peer, _prepare, _register, _sas, _serve


def _kept(site: Site) -> int:
    """How many teardowns ``site`` keeps to tell site B again (its API says)."""
    with site.client() as c:
        return int(c.get("/v1/peers/site-b").json()["unheard_teardowns"])


def test_a_teardown_b_did_not_hear_reaches_b_once_it_is_back(tmp_path: Path) -> None:
    with temporary_lab("pu") as lab, contextlib.ExitStack() as stack:
        url_a, url_b = _prepare(tmp_path / "a"), _prepare(tmp_path / "b")
        a = _register(_serve(stack, lab, url_a, "site-a"), url_a, "site-a", lab.host("left"), "gw-a")
        port_b = steady_port()  # not one another test or a connection could take while B is down
        first_b = stack.enter_context(contextlib.ExitStack())
        b = _register(_serve(first_b, lab, url_b, "site-b", port=port_b), url_b, "site-b", lab.host("right"), "gw-b")
        _peer(a, b)
        _peer(b, a)
        with a.client() as c:
            r = c.post("/v1/tunnels", json={"initiator": "gw-a", "responder": "gw-b@site-b"})
        assert r.status_code == 201, r.text
        tunnel = r.json()["id"]
        conn = f"qoss-{tunnel}"

        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait(timeout=10)
        first_b.close()
        with a.client() as c:
            assert c.delete(f"/v1/tunnels/{tunnel}").status_code == 204
            assert c.get("/v1/tunnels").json() == []
        assert _conns(a) == []
        assert _sas(a) == []
        assert conn in _conns(b)  # B's end stays: nobody could tell it
        assert _kept(a) == 1
        time.sleep(3)  # A tries again while B is still down: still kept
        assert _kept(a) == 1
        assert conn in _conns(b)

        _serve(stack, lab, url_b, "site-b", port=port_b)  # B is back, on the address A knows it by
        deadline = time.monotonic() + 40
        while (conn in _conns(b) or _kept(a)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert conn not in _conns(b)
        assert _sas(b) == []
        with b.client() as c:
            assert c.get("/v1/tunnels").json() == []
        assert _kept(a) == 0
