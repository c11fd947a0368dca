"""What checking every tunnel on a gateway costs when the monitor (re)connects to its charon.

    .venv/bin/python -m benchmarks.monitor_resync [--tunnels 500] [--concurrency 4] [--rounds 3] [--settle 2]

One lab (two charons with kernel-libipsec in network namespaces) and one real ``qoss serve``
(SQLite). N tunnels are brought up through ``POST /v1/tunnels`` (then ``--settle`` seconds
are left for the service's own monitor to check the last of them); then, in this process, a
tunnel monitor on the same database and charons checks all of them, rounds alternating
between two ways:

* **per tunnel**: :meth:`TunnelMonitor.check` of each tunnel, as after a down event: its
  record read, and one ``list-sas`` of its conn on each end (charon walks every IKE_SA it
  holds for each);
* **all at once**: :meth:`TunnelMonitor.check_all_on` (what a listener's connect does): the
  records read a page at a time, then one ``list-sas`` of each charon for all of them.

Every tunnel is up, so neither writes anything: what is timed is reading and asking. Prints
the median seconds of each way, the ratio, and the VICI calls each made. Then every tunnel
is deleted. Bounded by the number of tunnels (at most 5,000) and by ``--budget`` seconds for
the set-up.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from app.adapters.db.engine import make_session_factory
from app.adapters.db.unit_of_work import sql_units_of_work
from app.adapters.vici.gateway import ViciGateway
from app.bootstrap import engine_for
from app.domain.tunnels import TunnelState
from app.services.tunnel_monitor import TunnelMonitor
from app.settings import Settings
from benchmarks._harness import ThreadClients, all_tunnels, lab_and_service, left_sources


class _Counted:
    """A VICI gateway whose ``list-sas`` calls are counted."""

    calls = 0

    def __init__(self, path: str) -> None:
        self._gateway = ViciGateway(path, 60.0)

    def list_sas(self, **kw: Any) -> list[Any]:
        _Counted.calls += 1
        return self._gateway.list_sas(**kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gateway, name)


def _no_listener(path: str, callback: Callable[[Any], None]) -> Any:
    raise AssertionError("the benchmark's monitor is never started: it listens to nothing")


def _timed(fn: Callable[[], None]) -> tuple[float, int]:
    _Counted.calls = 0
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0, _Counted.calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tunnels", type=int, default=500, help="tunnels up on one gateway pair (default 500)")
    parser.add_argument("--concurrency", type=int, default=4, help="set-up and teardown requests at once (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each way, alternating (default 3)")
    parser.add_argument("--budget", type=float, default=900.0, help="seconds for the set-up (default 900)")
    parser.add_argument("--settle", type=float, default=2.0,
                        help="seconds left for the service's monitor to check the last set-ups (default 2)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # killed: still clean up
    n, c = max(1, min(args.tunnels, 5000)), max(1, min(args.concurrency, 32))
    with lab_and_service() as svc:
        right = svc.lab.host("right")
        sources = left_sources(svc, n)
        clients = ThreadClients(svc, timeout=120)
        deadline = time.monotonic() + args.budget
        engine = engine_for(Settings(database_url=svc.db_url))
        try:
            def create(source: str) -> None:
                if time.monotonic() < deadline:
                    clients.get().post("/v1/tunnels", json={
                        "initiator": "left", "responder": "right", "local_ts": [f"{source}/32"],
                        "remote_ts": [f"{right.inside_address}/32"]}).raise_for_status()

            with ThreadPoolExecutor(c) as pool:
                list(pool.map(create, sources))
            listed, _ = all_tunnels(clients.get())
            up = [t["id"] for t in listed if t["state"] == TunnelState.UP.value]
            print(f"{len(up)} of {n} tunnels up", flush=True)
            time.sleep(max(0.0, args.settle))  # the service's own monitor checks the last set-ups
            units = sql_units_of_work(make_session_factory(engine))
            monitor = TunnelMonitor(units=units, vici=_Counted, listen=_no_listener)  # never started
            left_socket = svc.lab.host("left").vici_socket

            def per_tunnel() -> None:
                for tunnel_id in up:
                    monitor.check(tunnel_id)

            ways: dict[str, Callable[[], None]] = {
                "per tunnel": per_tunnel, "all at once": lambda: monitor.check_all_on(left_socket)}
            seconds: dict[str, list[float]] = {way: [] for way in ways}
            calls: dict[str, int] = {}
            for r in range(max(1, args.rounds)):
                for way in (list(ways) if r % 2 == 0 else list(reversed(ways))):
                    took, calls[way] = _timed(ways[way])
                    seconds[way].append(took)
            changed = monitor.changes
            print(f"\nmonitor_resync: all {len(up)} tunnels on one gateway pair checked, {args.rounds} rounds each")
            for way in ways:
                print(f"  {way:11}: median {statistics.median(seconds[way]):.2f} s "
                      f"({', '.join(f'{s:.2f}' for s in seconds[way])}), {calls[way]} list-sas calls")
            ratio = statistics.median(seconds["per tunnel"]) / max(statistics.median(seconds["all at once"]), 1e-9)
            print(f"  per tunnel / all at once: {ratio:.1f}; states changed: {changed}")
        finally:
            engine.dispose()
            listed, _ = all_tunnels(clients.get())
            with ThreadPoolExecutor(c) as pool:
                list(pool.map(lambda t: clients.get().delete(f"/v1/tunnels/{t['id']}"), listed))
            clients.close()


if __name__ == "__main__":
    main()
