"""Reads a service makes on its own, or on every request of a kind, that must not grow with
every tunnel it holds.

    .venv/bin/python -m benchmarks.tunnel_reads [--tunnels 2000 10000] [--rounds 9]

Builds a migrated SQLite database with N tunnel records (every one ``up``, five responder ends of
peered tunnels still ``configuring``, every tenth tunnel to an unmanaged peer) and times, rounds
alternating, two ways to each answer:

* **the peers' sweep** (every second on a service with peering: the ends it loaded as a
  responder and never saw confirmed): every record read and decoded, then the ``configuring``
  responder ends picked out in Python, against only the ``configuring`` records read a page at a
  time (``app.services.tunnels.every_tunnel``), as the sweep does;
* **a tunnel to an unmanaged peer** (``POST /v1/tunnels`` with ``peer``, checked twice on its
  path: is another tunnel from this gateway joined to a far end with the same identities?):
  every record read and compared in Python, against the one statement the check makes
  (``TunnelStore.joining``).

Prints the median of each per N and their ratio (the sweep's also as the share of one core at one
sweep a second). Nothing is loaded into a charon: what is timed is the read.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.unit_of_work import sql_units_of_work
from app.domain.ports import UnitOfWorkFactory
from app.domain.tunnels import PeerEnd, TunnelRecord, TunnelState
from app.services.peering import responder
from app.services.tunnels import every_tunnel
from benchmarks._harness import prepared_database

_CONFIGURING = 5


def _fill(units: UnitOfWorkFactory, count: int) -> None:
    negotiation = {"suite": {"protocol": "esp", "encryption": "aes128gcm16", "integrity": None},
                   "proposals": {"esp": "aes128gcm16-x25519", "ike": "aes128gcm16-prfsha256-x25519"}}
    with units() as uow:
        for n in range(count):
            setting_up = n % (count // _CONFIGURING) == 0
            unmanaged = not setting_up and n % 10 == 1
            peer = (PeerEnd(address=f"192.0.2.{n % 250}", identity=f"far-{n}", local_identity="gw-b.qoss")
                    if unmanaged else
                    PeerEnd(address="192.0.2.1", identity=f"{n:012x}.gw-a", local_identity=f"{n:012x}.gw-b",
                            site="site-a", gateway=None, role="responder"))
            uow.tunnels.add(TunnelRecord(
                id=f"{n:012x}", initiator="gw-b", responder=None, local_ts=(f"10.2.{n // 250}.{n % 250}/32",),
                remote_ts=(f"10.1.{n // 250}.{n % 250}/32",), negotiation=negotiation,
                state=TunnelState.CONFIGURING if setting_up else TunnelState.UP, peer=peer,
                provenance={"request": {"min_levels": {"confidentiality": 8, "integrity": 8}}, "peer": "site-a"}),
                keep_transaction=False)
        uow.commit()


def _every(units: UnitOfWorkFactory) -> int:
    with units() as reads:
        return len([r for r in reads.tunnels.list() if r.peer is not None and r.peer.role == "responder"
                    and r.state is TunnelState.CONFIGURING])


def _sweeps(units: UnitOfWorkFactory) -> int:
    return len([r for r in every_tunnel(units, page=responder.SWEEP_PAGE, state=TunnelState.CONFIGURING)
                if r.peer is not None and r.peer.role == "responder"])


#: What the identity check looks for: a far end no tunnel has (the check's usual answer).
_WANTED = ("gw-b", "far-new", "gw-b.qoss")


def _every_identity(units: UnitOfWorkFactory) -> int:
    with units() as reads:
        initiator, identity, local = _WANTED
        return len([r for r in reads.tunnels.list() if r.initiator == initiator and r.peer is not None
                    and (r.peer.identity, r.peer.local_identity) == (identity, local)])


def _joining(units: UnitOfWorkFactory) -> int:
    with units() as reads:
        return int(reads.tunnels.joining(*_WANTED) is not None)


def _timed(fn: Callable[[UnitOfWorkFactory], int], units: UnitOfWorkFactory, expected: int) -> float:
    start = time.perf_counter()
    found = fn(units)
    took = time.perf_counter() - start
    assert found == expected, found
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tunnels", type=int, nargs="+", default=[2000, 10000])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    if any(not 10 <= n <= 50_000 for n in args.tunnels) or not 1 <= args.rounds <= 200:
        parser.error("--tunnels between 10 and 50,000, --rounds between 1 and 200")
    for count in args.tunnels:
        with tempfile.TemporaryDirectory(prefix="qoss-reads-") as where:
            url = f"sqlite:///{Path(where) / 'qoss.db'}"
            prepared_database(url)  # migrated as `qoss db upgrade` does
            engine = make_engine(url)
            try:
                units = sql_units_of_work(make_session_factory(engine))
                _fill(units, count)
                every: list[float] = []
                sweeps: list[float] = []
                scans: list[float] = []
                joins: list[float] = []
                for _ in range(args.rounds):  # the two ways take turns
                    every.append(_timed(_every, units, _CONFIGURING))
                    sweeps.append(_timed(_sweeps, units, _CONFIGURING))
                    scans.append(_timed(_every_identity, units, 0))
                    joins.append(_timed(_joining, units, 0))
            finally:
                engine.dispose()
        e, s = statistics.median(every), statistics.median(sweeps)
        print(f"{count} tunnels, medians of {args.rounds}: the peers' sweep ({_CONFIGURING} being set up): every "
              f"tunnel read {e * 1000:.1f} ms ({e * 100:.1f} % of a core at one sweep a second), the sweep's read "
              f"{s * 1000:.2f} ms ({s * 100:.2f} %): {e / s:.0f}x less")
        a, b = statistics.median(scans), statistics.median(joins)
        print(f"{count} tunnels, medians of {args.rounds}: an unmanaged peer's identities: every tunnel read "
              f"{a * 1000:.1f} ms, the check's one statement {b * 1000:.2f} ms: {a / b:.0f}x less")


if __name__ == "__main__":
    main()
