"""A move the other side loaded and never saw confirmed goes back by itself, even when that side's
qoss is killed outright (SIGKILL) in between: the janitor beside ``qoss serve`` loads the old
conn back at the move's deadline, and the tunnel runs on its old SA throughout."""

from __future__ import annotations

import contextlib
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.adapters.agent.crypto import PublicKeys
from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.unit_of_work import sql_units_of_work
from app.adapters.peering import peering_keys
from app.domain.agent import Kind, canonical
from app.domain.peering import PENDING_FOR
from tests.integration.charon.conftest import temporary_lab
from tests.integration.tunnels.test_peered import Site, _peer, _ping, _two_sites


@pytest.fixture
def sites(tmp_path: Path) -> Iterator[tuple[Site, Site]]:
    with temporary_lab("pm") as lab, contextlib.ExitStack() as stack:
        a, b = _two_sites(stack, lab, tmp_path)
        _peer(a, b)
        _peer(b, a)
        yield a, b


def _installed(site: Site, conn: str) -> list[tuple[str, str]]:
    """The INSTALLED CHILD_SAs of ``conn`` on the site's charon (unique id, algorithms), as ``swanctl --list-sas``
    prints them."""
    out = subprocess.run(["swanctl", "--list-sas", "--ike", conn, "--uri", f"unix://{site.host.vici_socket}"],
                         capture_output=True, text=True, timeout=10, check=True).stdout
    return re.findall(r"#(\d+), reqid \d+, INSTALLED, TUNNEL[^,]*, (\S+)", out)


def _initiate_at(site: Site, conn: str) -> str:
    """What the site's charon says when asked for another CHILD_SA of ``conn`` with the config it has
    loaded now: one equal to the running SA's is refused as its duplicate (charon's own words); any
    other is negotiated with the other side."""
    done = subprocess.run(["swanctl", "--initiate", "--child", conn, "--timeout", "10", "--uri",
                           f"unix://{site.host.vici_socket}"], capture_output=True, text=True, timeout=30, check=False)
    return done.stdout + done.stderr


def test_a_move_never_confirmed_goes_back_after_the_other_sides_qoss_is_killed(sites: tuple[Site, Site]) -> None:
    a, b = sites
    with a.client() as c:
        r = c.post("/v1/tunnels", json={"initiator": "gw-a", "responder": "gw-b@site-b",
                                        "min_levels": {"confidentiality": 8, "integrity": 8}})
    assert r.status_code == 201, r.text
    tunnel = r.json()
    conn = tunnel["conn"]
    (old,) = _installed(b, conn)
    assert "AES_GCM_16-128" in old[1], old
    engine = make_engine(a.db)  # this test plays site A's qoss for the move, with A's own keys
    try:
        with sql_units_of_work(make_session_factory(engine))() as uow:
            keys = peering_keys(uow, "site-a")
    finally:
        engine.dispose()
    with b.client() as c:
        identity = c.get("/v1/peering/identity").json()
    move = {"tunnel_id": tunnel["id"], "sender": "site-a", "timestamp": int(time.time()),
            "nonce": secrets.token_urlsafe(18), "suites": ["aes256gcm16-x25519"], "ikes": [tunnel["proposals"]["ike"]]}
    kem = PublicKeys.from_text(identity["sign_public_key"], identity["kem_public_key"]).kem
    wire = keys.seal(kind=Kind.PEER_MOVE, to="site-b", body=canonical(move), recipient=kem)
    answer = httpx.post(f"{b.base}/v1/peering/messages", content=wire, headers={"content-type": "application/json"},
                        timeout=30)
    assert answer.status_code == 200, answer.text
    assert _installed(b, conn) == [old]  # the choice is loaded beside the running SA, which stays
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait(timeout=10)
    pending = Path(b.db.removeprefix("sqlite:///")).parent / "state" / "peering" / "pending" / f"{conn}.json"
    deadline = time.monotonic() + PENDING_FOR + 10
    while pending.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not pending.exists()  # the janitor acted at the move's deadline
    assert _installed(b, conn) == [old]
    assert _ping(a, b)  # the old SA carried on throughout
    # B's charon has the old conn again: asked for another CHILD_SA, it finds the running one its duplicate.
    said = _initiate_at(b, conn)
    assert "due to existing duplicate" in said, said
    assert _installed(b, conn) == [old]
