"""A move of a peered tunnel is claimed in the moving side's record, so that the processes of one
side (replicas on one database, the command line beside the server) never move the same tunnel at
once, and a replica asked by the peer to move it sees the move another replica is making (the
lesser name's move goes on). Site B over a fake charon, two ``Peering`` on its one database standing
for two of its processes; the peers answer through a link in this process."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import pytest

from app.domain.agent import Kind
from app.domain.errors import Conflict, QossError
from app.services.peering.moves import moving_out
from app.settings import Settings
from tests.api.test_peering_moves import _A, _C, _Answers, _move, _peering, _post, _sealed, _units, site_b
from tests.unit.services.test_tunnels_service import up_on_initiate

pytestmark = pytest.mark.anyio

__all__ = ["site_b"]  # the fixture, used by name


class _Held(_Answers):
    """A peer that holds its answer to a move until ``go_on`` is set (at most 5 s)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked, self.go_on = threading.Event(), threading.Event()

    def post(self, peer: str, url: str, data: bytes, timeout: float) -> tuple[int, bytes]:
        if not self.asked.is_set():
            self.asked.set()
            self.go_on.wait(5)
        return super().post(peer, url, data, timeout)


async def _asked(link: _Held) -> None:
    for _ in range(500):  # at most 5 s
        if link.asked.is_set():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the first move never reached its peer")


async def test_a_tunnel_one_process_is_moving_is_not_moved_by_another_of_the_same_side(
        site_b: Any, settings: Settings) -> None:
    _, c, fake, identity = site_b
    up_on_initiate(fake)  # the new CHILD_SA comes up beside the running one
    first_link, second_link = _Held(_A, "site-a", identity), _Answers(_A, "site-a", identity)
    with _units(settings) as units_1, _units(settings) as units_2:
        first, second = _peering(units_1, first_link), _peering(units_2, second_link)
        moving = asyncio.ensure_future(asyncio.to_thread(first.move_tunnel, tunnel_id="t-a"))
        try:
            await _asked(first_link)
            with units_2() as uow:
                assert moving_out(uow.tunnels.get("t-a"), time.time()) is not None  # claimed in the record
            with pytest.raises(Conflict, match="under way"):
                await asyncio.to_thread(second.move_tunnel, tunnel_id="t-a")
            assert second_link.got == []  # the second process sent the peer nothing
        finally:
            first_link.go_on.set()
        _, close_old = await moving
        close_old()
    assert [k for k, _ in first_link.got] == [Kind.PEER_MOVE, Kind.PEER_MOVED]
    record = (await c.get("/v1/tunnels/t-a")).json()
    assert "moving_out" not in (record["provenance"] or {})  # the claim is taken off after the move
    assert fake.count("initiate") == 1


async def test_a_peers_move_meets_the_move_another_replica_here_is_making_and_the_lesser_name_goes_on(
        site_b: Any, settings: Settings) -> None:
    _, c, fake, identity = site_b
    up_on_initiate(fake)
    link = _Held(_C, "site-c", identity)
    with _units(settings) as units:
        replica = _peering(units, link)  # site-b moving site-c's tunnel in another process
        moving = asyncio.ensure_future(asyncio.to_thread(replica.move_tunnel, tunnel_id="t-c"))
        try:
            await _asked(link)
            # site-c asks the server (another process of site-b) to move the same tunnel: site-b < site-c,
            # so site-b's own move goes on and site-c's is refused, with nothing loaded for it.
            loads = fake.count("load-conn")
            r = await _post(c, _sealed(identity, _move(tunnel_id="t-c", sender="site-c"), keys=_C))
            assert r.status_code == 403, r.text
            assert fake.count("load-conn") == loads
        finally:
            link.go_on.set()
        _, close_old = await moving
        close_old()
    # A move of site-a's tunnel while site-b moves it: site-a < site-b, so site-a's goes on here.
    link_a = _Held(_A, "site-a", identity)
    with _units(settings) as units:
        replica = _peering(units, link_a)
        moving = asyncio.ensure_future(asyncio.to_thread(replica.move_tunnel, tunnel_id="t-a"))
        try:
            await _asked(link_a)
            r = await _post(c, _sealed(identity, _move()))
            assert r.status_code == 200, r.text
        finally:
            link_a.go_on.set()
        # What becomes of site-b's own move is site-a's to say (it refuses it, as its own goes on);
        # this stand-in for site-a answers anything, so the move only has to end.
        with contextlib.suppress(QossError):
            await moving
