"""What the peers' sweep costs a service that holds many tunnels.

    .venv/bin/python -m benchmarks.peered_sweep [--tunnels 2000 10000] [--rounds 15]

Every second, a ``qoss serve`` with peering looks for the ends it loaded as a responder and never
saw confirmed. This builds a migrated SQLite database with N tunnel records (every one ``up`` but
five responder ends still ``configuring``) and times, rounds alternating, two reads of the same
answer:

* **every tunnel**: every record read and decoded, then the ``configuring`` responder ends picked
  out in Python;
* **the sweep's**: only the ``configuring`` records, read a page at a time
  (``app.services.peering.responder``), as the sweep does.

Prints the median of each per N, their ratio, and the CPU share of one core each would take at
one sweep a second. Nothing is loaded into a charon: what is timed is the read, which is all a
sweep does when nothing is overdue.
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
from benchmarks._harness import prepared_database

_CONFIGURING = 5


def _fill(units: UnitOfWorkFactory, count: int) -> None:
    negotiation = {"suite": {"protocol": "esp", "encryption": "aes128gcm16", "integrity": None},
                   "proposals": {"esp": "aes128gcm16-x25519", "ike": "aes128gcm16-prfsha256-x25519"}}
    with units() as uow:
        for n in range(count):
            setting_up = n % (count // _CONFIGURING) == 0
            uow.tunnels.add(TunnelRecord(
                id=f"{n:012x}", initiator="gw-b", responder=None, local_ts=(f"10.2.{n // 250}.{n % 250}/32",),
                remote_ts=(f"10.1.{n // 250}.{n % 250}/32",), negotiation=negotiation,
                state=TunnelState.CONFIGURING if setting_up else TunnelState.UP,
                peer=PeerEnd(address="192.0.2.1", identity=f"{n:012x}.gw-a", local_identity=f"{n:012x}.gw-b",
                             site="site-a", gateway=None, role="responder"),
                provenance={"request": {"min_levels": {"confidentiality": 8, "integrity": 8}}, "peer": "site-a"}),
                keep_transaction=False)
        uow.commit()


def _every(units: UnitOfWorkFactory) -> int:
    with units() as reads:
        return len([r for r in reads.tunnels.list() if r.peer is not None and r.peer.role == "responder"
                    and r.state is TunnelState.CONFIGURING])


def _sweeps(units: UnitOfWorkFactory) -> int:
    with units() as reads:
        return len([r for r in responder._configuring(reads) if r.peer is not None and r.peer.role == "responder"])


def _timed(fn: Callable[[UnitOfWorkFactory], int], units: UnitOfWorkFactory) -> float:
    start = time.perf_counter()
    found = fn(units)
    took = time.perf_counter() - start
    assert found == _CONFIGURING, found
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tunnels", type=int, nargs="+", default=[2000, 10000])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    if any(not 10 <= n <= 50_000 for n in args.tunnels) or not 1 <= args.rounds <= 200:
        parser.error("--tunnels between 10 and 50,000, --rounds between 1 and 200")
    for count in args.tunnels:
        with tempfile.TemporaryDirectory(prefix="qoss-sweep-") as where:
            url = f"sqlite:///{Path(where) / 'qoss.db'}"
            prepared_database(url)  # migrated as `qoss db upgrade` does
            engine = make_engine(url)
            try:
                units = sql_units_of_work(make_session_factory(engine))
                _fill(units, count)
                every: list[float] = []
                sweeps: list[float] = []
                for _ in range(args.rounds):  # the two ways take turns
                    every.append(_timed(_every, units))
                    sweeps.append(_timed(_sweeps, units))
            finally:
                engine.dispose()
        e, s = statistics.median(every), statistics.median(sweeps)
        print(f"{count} tunnels ({_CONFIGURING} being set up), median of {args.rounds}: every tunnel read "
              f"{e * 1000:.1f} ms ({e * 100:.1f} % of a core at one sweep a second), the sweep's read "
              f"{s * 1000:.2f} ms ({s * 100:.2f} %): {e / s:.0f}x less")


if __name__ == "__main__":
    main()
