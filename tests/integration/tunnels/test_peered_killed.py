"""The responder's qoss killed outright (SIGKILL) between its load and the initiator's initiate,
while the initiator confirms as it initiates: the initiator answers a 5xx naming the peer and
keeps nothing, and within the expiry nothing of the attempt remains on the responder's charon.

Two ``qoss serve`` on one lab, each driving its own charon (as in ``test_peered``); site A
reaches site B through a small HTTP relay that passes A's offer and B's answer on, and at A's
next message (the confirm, sent as A initiates) kills B's ``qoss serve`` and closes the
connection unanswered.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.domain.peering import PENDING_FOR
from tests.integration.charon.conftest import temporary_lab
from tests.integration.tunnels.test_peered import Site, _conns, _peer, _sas, _two_sites


class _Relay(ThreadingHTTPServer):
    """Passes POSTs on to ``target``; the ``kill_at``-th (from 1) kills ``victim`` instead, unanswered."""

    daemon_threads = True

    def __init__(self, target: Site, kill_at: int) -> None:
        super().__init__(("127.0.0.1", 0), _Pass)
        self.target, self.kill_at, self.seen = target, kill_at, 0
        self.lock = threading.Lock()

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the killed side's connections end badly: expected here


class _Pass(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Relay

    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers.get("content-length", "0")))
        relay = self.server
        with relay.lock:
            relay.seen += 1
            kill = relay.seen == relay.kill_at
        if kill or relay.target.proc.poll() is not None:
            if kill:
                relay.target.proc.send_signal(signal.SIGKILL)
                relay.target.proc.wait(timeout=10)
            self.close_connection = True  # no answer: as a server killed mid-request
            return
        try:
            r = httpx.post(f"{relay.target.base}{self.path}", content=data, timeout=10,
                           headers={"content-type": self.headers.get("content-type", "application/json")})
        except httpx.HTTPError:
            self.close_connection = True
            return
        self.send_response(r.status_code)
        self.send_header("content-type", r.headers.get("content-type", "application/json"))
        self.send_header("content-length", str(len(r.content)))
        self.end_headers()
        self.wfile.write(r.content)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def sites(tmp_path: Path) -> Iterator[tuple[Site, Site, _Relay]]:
    with temporary_lab("pk") as lab, contextlib.ExitStack() as stack:
        a, b = _two_sites(stack, lab, tmp_path)
        _peer(b, a)
        relay = _Relay(b, kill_at=2)
        thread = threading.Thread(target=relay.serve_forever, daemon=True)
        thread.start()
        stack.callback(thread.join, 5)
        stack.callback(relay.server_close)
        stack.callback(relay.shutdown)
        with b.client() as c:
            identity = c.get("/v1/peering/identity").json()
        with a.client() as c:  # B, as A reaches it: through the relay
            r = c.post("/v1/peers", json={
                "name": "site-b", "url": f"http://127.0.0.1:{relay.server_address[1]}",
                "sign_public_key": identity["sign_public_key"], "kem_public_key": identity["kem_public_key"],
                "gateways": ["gw-a"], "networks": [f"{a.host.inside_address}/32"],
                "min_levels": {"confidentiality": 1}})
            assert r.status_code == 201, r.text
        yield a, b, relay


def _settled(check: Any, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.5)
    return bool(check())


def test_bs_qoss_killed_as_a_confirms_leaves_nothing_on_either_charon_and_a_answers_5xx(
        sites: tuple[Site, Site, _Relay]) -> None:
    a, b, relay = sites
    with a.client() as c:
        r = c.post("/v1/tunnels", json={"initiator": "gw-a", "responder": "gw-b@site-b"})
        assert 500 <= r.status_code < 600, r.text
        assert "site-b" in r.json()["detail"]
        assert c.get("/v1/tunnels").json() == []
    assert relay.seen >= 2  # the offer went through; B was killed at the confirm
    assert b.proc.poll() is not None
    assert _conns(a) == []
    assert _settled(lambda: _sas(a) == [], 10)
    # B's janitor unloads its end at the offer's expiry, B's qoss gone.
    assert _settled(lambda: _conns(b) == [] and _sas(b) == [], PENDING_FOR + 10)
