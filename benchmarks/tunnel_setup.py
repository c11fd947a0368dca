"""Tunnel set-up time: POST /v1/tunnels until verified up, against a bare VICI initiate.

    .venv/bin/python -m benchmarks.tunnel_setup [--rounds 20]

Same run, same lab (two charons, kernel-libipsec, network namespaces), same suite:
- qoss: POST /v1/tunnels -> 201 (negotiate, load secret+conn on both ends, initiate,
  verified on both ends), timed by the client; then DELETE (timed for the minimal client: until
  the 204, both ends terminated and unloaded, the record gone). Sent twice per round:
  by a minimal HTTP/1.1 client (``benchmarks._harness.LeanConnection``: the request in one
  write, the answer read by its length; the goal's figure) and by httpx, whose own work
  (building the request, parsing the answer: about half a millisecond here) is printed apart.
- bare: the same conn and secret loaded beforehand (not timed), then only VICI
  ``initiate`` timed, charon answering once the SAs are up (as ``swanctl --initiate`` waits);
  then terminate and unload (not timed). The goal's reference.
- bare teardown: ``terminate`` on the initiator (charon waiting), then ``unload-conn`` and
  ``unload-shared`` on both ends, one command after another, as an administrator would: the
  DELETE's reference.
- bare, not waiting: the same, but ``initiate`` with ``timeout -1`` (charon answers at once and
  streams no log) timed until charon's ``child-updown`` event for the conn: what charon takes
  when asked the way qoss asks it between two managed gateways (``QOSS_DETACHED_INITIATE``).
- floor: what every set-up must do, alone - load secret and conn on both
  ends (the ends at once), ``initiate``, ``list-sas`` on both ends (at once) - over VICI
  sessions opened beforehand (no connect per command), without HTTP, database or
  negotiation: no implementation of the API can be faster than this plus one HTTP round
  trip (measured too: ``GET /livez`` on the same server).
- peered: the same server is site A of a peering (``QOSS_PEER_NAME=site-a``); a second
  ``qoss serve`` (site B, its own SQLite database, rating tables and policies) drives the right
  charon as ``gw-b`` and each is registered as the other's peer. ``POST /v1/tunnels`` left ->
  ``gw-b@site-b`` -> 201 by the minimal client (A's offer, B's choice and load, A's load,
  initiate and verification, B's confirmation), in the same rounds as the local one, taking
  turns with it; then DELETE (not timed).
- post-quantum: the local ``POST /v1/tunnels`` with a post-quantum minimum (``post_quantum`` 5:
  a fresh PPK loaded into both charons beside the PSK, conns with ``ppk_id`` and
  ``ppk_required``, ``/PPK`` verified on both ends; then DELETE, not timed), by the minimal
  client in the same rounds, taking turns with the local one: what a PPK adds to a set-up; and
  the bare VICI initiate of the same conn with a PPK on both ends (loaded beforehand, not timed):
  what it adds to charon's own work.
- peered floor: the floor's steps with the right end's loads done before the left's begin (a
  responder loads before it answers, the initiator after it has the answer), plus one HTTP round
  trip and an offer and an answer sealed and opened in this process: what no peered set-up can go
  below, and what it leaves, under the peered goal, for everything else the two services do.
Prints the medians and the ratios. Goals: qoss <= 2.0 x bare (the floor with one HTTP round
trip is about 1.7 x on the lab); peered <= 1.3 x local.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import vici

from app.adapters.agent.crypto import KeyPair
from app.adapters.vici.gateway import ViciGateway
from app.adapters.vici.session import unix_connect
from app.domain.agent import Kind, canonical
from app.domain.tunnels import TunnelEnd, conn_payload
from benchmarks._harness import LeanConnection, UpWatch, lab_and_service, percentile
from benchmarks.peered_setup import Site, far_site


def _floor(sessions: tuple[Any, Any], pool: ThreadPoolExecutor, name: str, ends: tuple[TunnelEnd, TunnelEnd],
           proposals: dict[str, Any], *, one_after_the_other: bool = False) -> float:
    """The required steps alone over open sessions; seconds. Leaves nothing loaded.

    ``one_after_the_other``: the right end's loads done before the left's begin, as between two
    qoss services (the responder loads before it answers, the initiator after it has the answer)."""
    psk = secrets.token_bytes(32)

    def load(k: int) -> None:
        local, remote = ends[k], ends[1 - k]
        sessions[k].load_shared({"id": name, "type": "IKE", "data": psk, "owners": [local.identity, remote.identity]})
        sessions[k].load_conn({name: conn_payload(
            name=name, local=local, remote=remote, ike_proposal=proposals["ike"], esp_proposal=proposals["esp"],
            ah_proposal=None, mode="tunnel", ike_lifetime=14400, child_lifetime=3600)})

    try:
        t0 = time.perf_counter()
        if one_after_the_other:
            load(1)
            load(0)
        else:
            for future in [pool.submit(load, 1), pool.submit(load, 0)]:
                future.result()
        for _ in sessions[0].initiate({"child": name, "ike": name, "timeout": 10000, "loglevel": 1,
                                       "init-limits": "no"}):
            pass
        sas = list(pool.map(lambda s: list(s.list_sas({"ike": name})), sessions))
        elapsed = time.perf_counter() - t0
        if not all(any(name in event for event in found) for found in sas):
            raise RuntimeError(f"floor: {name} not up on both ends")
        return elapsed
    finally:
        with contextlib.suppress(vici.exception.CommandException):
            for _ in sessions[0].terminate({"ike": name, "force": "yes", "timeout": 5000}):
                pass
        for s in sessions:
            with contextlib.suppress(vici.exception.CommandException):
                s.unload_conn({"name": name})
            with contextlib.suppress(vici.exception.CommandException):
                s.unload_shared({"id": name})


def _sealing(rounds: int) -> float:
    """A peered set-up's message crypto alone, in this process: an offer-sized message sealed by A
    (Ed25519, then HPKE to B's X25519 key) and opened by B, and an answer-sized one back; the
    median over ``rounds`` (plus 20 untimed) of the four steps together, in ms."""
    a, b = KeyPair.generate("site-a"), KeyPair.generate("site-b")
    offer, answer = canonical({"pad": "o" * 900}), canonical({"pad": "a" * 400})
    took: list[float] = []
    for i in range(rounds + 20):
        t0 = time.perf_counter()
        sent = a.seal(kind=Kind.PEER_OFFER, to="site-b", body=offer, recipient=b.public.kem)
        b.open_sealed(sent, kinds=(Kind.PEER_OFFER,))
        back = b.seal(kind=Kind.PEER_ANSWER, to="site-a", body=answer, recipient=a.public.kem)
        a.open_sealed(back, kinds=(Kind.PEER_ANSWER,))
        if i >= 20:
            took.append((time.perf_counter() - t0) * 1000)
    return statistics.median(took)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="qoss-setup-", dir="/tmp"))  # the two sites' state directories
    (state / "site-a").mkdir()
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, state, ignore_errors=True)
        # Site A's state directory (its audit key, peering keys and pending loads) for the server
        # and for the token made in its database before it starts.
        stack.enter_context(mock.patch.dict(os.environ, {"QOSS_STATE_DIR": str(state / "site-a")}))
        svc = stack.enter_context(lab_and_service(env={"QOSS_PEER_NAME": "site-a"}))
        stack.enter_context(far_site(Site(svc.base_url, svc.headers, None), svc.lab, state))
        _measure(svc, args.rounds)


def _measure(svc: Any, rounds: int) -> None:
    with httpx.Client(base_url=svc.base_url, timeout=30, headers=svc.headers) as client, \
            ThreadPoolExecutor(2) as pool, contextlib.closing(UpWatch(svc.lab.host("left").vici_socket)) as watch, \
            contextlib.ExitStack() as stack:
        left, right = svc.lab.host("left"), svc.lab.host("right")
        detached: list[float] = []
        floor: list[float] = []
        peered_floor: list[float] = []  # the same, the right end's loads before the left's
        body = {"initiator": "left", "responder": "right", "min_levels": {"confidentiality": 8, "integrity": 8}}
        ours: list[float] = []
        with_ppk: list[float] = []  # POST left -> right with a post-quantum minimum, by the minimal client
        peered: list[float] = []  # POST left -> gw-b@site-b by the minimal client
        deletes: list[float] = []  # DELETE /v1/tunnels/{id} by the minimal client
        bare_down: list[float] = []  # terminate on one end, unload conn and secret on both
        with_httpx: list[float] = []
        bare: list[float] = []
        bare_ppk: list[float] = []  # the bare initiate of a conn with a PPK on both ends
        proposals: dict[str, Any] | None = None
        loop = asyncio.new_event_loop()
        stack.callback(loop.close)
        lean = loop.run_until_complete(LeanConnection.open(svc.base_url, svc.headers))
        stack.callback(lean.close)
        content = json.dumps(body).encode()
        to_peer = json.dumps({**body, "responder": "gw-b@site-b"}).encode()
        post_quantum = json.dumps({**body, "min_levels": {"confidentiality": 8, "integrity": 8,
                                                           "post_quantum": 5}}).encode()

        def by_httpx() -> float:
            nonlocal proposals
            t0 = time.perf_counter()
            r = client.post("/v1/tunnels", json=body)
            elapsed = time.perf_counter() - t0
            r.raise_for_status()
            proposals = r.json()["proposals"]
            client.delete(f"/v1/tunnels/{r.json()['id']}").raise_for_status()
            return elapsed

        def by_lean() -> tuple[float, float]:
            t0 = time.perf_counter()
            answer = loop.run_until_complete(lean.request("POST", "/v1/tunnels", content))
            elapsed = time.perf_counter() - t0
            if answer.status != 201:
                raise RuntimeError(f"{answer.status} {answer.body[:200]!r}")
            t0 = time.perf_counter()
            gone = loop.run_until_complete(lean.request("DELETE", f"/v1/tunnels/{json.loads(answer.body)['id']}"))
            took = time.perf_counter() - t0
            if gone.status != 204:
                raise RuntimeError(f"DELETE: {gone.status} {gone.body[:200]!r}")
            return elapsed, took

        def by_lean_ppk() -> float:
            t0 = time.perf_counter()
            answer = loop.run_until_complete(lean.request("POST", "/v1/tunnels", post_quantum))
            elapsed = time.perf_counter() - t0
            made = json.loads(answer.body)
            if answer.status != 201 or made["suite"]["post_quantum"] != "ppk":
                raise RuntimeError(f"post-quantum: {answer.status} {answer.body[:200]!r}")
            gone = loop.run_until_complete(lean.request("DELETE", f"/v1/tunnels/{made['id']}"))
            if gone.status != 204:
                raise RuntimeError(f"post-quantum DELETE: {gone.status} {gone.body[:200]!r}")
            return elapsed

        def by_peer() -> float:
            t0 = time.perf_counter()
            answer = loop.run_until_complete(lean.request("POST", "/v1/tunnels", to_peer))
            elapsed = time.perf_counter() - t0
            if answer.status != 201:
                raise RuntimeError(f"peered: {answer.status} {answer.body[:200]!r}")
            gone = loop.run_until_complete(lean.request("DELETE", f"/v1/tunnels/{json.loads(answer.body)['id']}"))
            if gone.status != 204:
                raise RuntimeError(f"peered DELETE: {gone.status} {gone.body[:200]!r}")
            return elapsed

        for i in range(rounds + 2):  # two warm-up rounds
            # The clients and kinds take turns going first: the first after the pause pays for waking the machine.
            if i % 2:
                elapsed_peered = by_peer()
                elapsed_ppk = by_lean_ppk()
                (elapsed_lean, elapsed_delete), elapsed = by_lean(), by_httpx()
            else:
                elapsed, (elapsed_lean, elapsed_delete) = by_httpx(), by_lean()
                elapsed_ppk = by_lean_ppk()
                elapsed_peered = by_peer()
            if i >= 2:
                with_ppk.append(elapsed_ppk * 1000)
                peered.append(elapsed_peered * 1000)
                with_httpx.append(elapsed * 1000)
                ours.append(elapsed_lean * 1000)
                deletes.append(elapsed_delete * 1000)

            name = f"bare-{i}"
            psk = secrets.token_bytes(32)
            ends = (TunnelEnd(left.ike_address, f"{name}.left", (f"{left.inside_address}/32",)),
                    TunnelEnd(right.ike_address, f"{name}.right", (f"{right.inside_address}/32",)))
            gws = (ViciGateway(left.vici_socket), ViciGateway(right.vici_socket))
            for gw, (local, remote) in ((gws[1], (ends[1], ends[0])), (gws[0], ends)):
                gw.load_shared(name, psk, [local.identity, remote.identity])
                gw.load_conn(name, conn_payload(name=name, local=local, remote=remote, ike_proposal=proposals["ike"],
                                                esp_proposal=proposals["esp"], ah_proposal=None, mode="tunnel",
                                                ike_lifetime=14400, child_lifetime=3600))
            t0 = time.perf_counter()
            gws[0].initiate(child=name, ike=name)
            elapsed = time.perf_counter() - t0
            if i >= 2:
                bare.append(elapsed * 1000)
            if not watch.wait(name, 10):  # its event seen, before it is forgotten
                raise RuntimeError(f"bare: no child-updown for {name}")
            gws[0].terminate(ike=name, force=True)
            watch.forget(name)
            t0 = time.perf_counter()  # the same conn once more, charon not waiting
            gws[0].initiate(child=name, ike=name, timeout_ms=-1)
            if not watch.wait(name, 10):
                raise RuntimeError(f"bare, not waiting: {name} not up")
            elapsed = time.perf_counter() - t0
            if i >= 2:
                detached.append(elapsed * 1000)
            t0 = time.perf_counter()  # taken down as an administrator would, one command after another
            gws[0].terminate(ike=name, force=True)
            for gw in gws:
                gw.unload_conn(name)
                gw.unload_shared(name)
            if i >= 2:
                bare_down.append((time.perf_counter() - t0) * 1000)

            pq = f"bare-pq-{i}"  # the same, with a PPK on both ends
            ppk_id, ppk = f"{pq}-id", secrets.token_bytes(32)
            pq_ends = (TunnelEnd(left.ike_address, f"{pq}.left", (f"{left.inside_address}/32",)),
                       TunnelEnd(right.ike_address, f"{pq}.right", (f"{right.inside_address}/32",)))
            for gw, (local, remote) in ((gws[1], (pq_ends[1], pq_ends[0])), (gws[0], pq_ends)):
                gw.load_shared(pq, psk, [local.identity, remote.identity])
                gw.load_shared(f"{pq}-ppk", ppk, [ppk_id], "PPK")
                gw.load_conn(pq, conn_payload(name=pq, local=local, remote=remote, ike_proposal=proposals["ike"],
                                              esp_proposal=proposals["esp"], ah_proposal=None, mode="tunnel",
                                              ike_lifetime=14400, child_lifetime=3600, ppk_id=ppk_id))
            t0 = time.perf_counter()
            gws[0].initiate(child=pq, ike=pq)
            if i >= 2:
                bare_ppk.append((time.perf_counter() - t0) * 1000)
            gws[0].terminate(ike=pq, force=True)
            for gw in gws:
                gw.unload_conn(pq)
                gw.unload_shared(pq)
                gw.unload_shared(f"{pq}-ppk")

            with unix_connect(left.vici_socket, 30) as s_left, unix_connect(right.vici_socket, 30) as s_right:
                f_name = f"floor-{i}"
                f_ends = (TunnelEnd(left.ike_address, f"{f_name}.left", (f"{left.inside_address}/32",)),
                          TunnelEnd(right.ike_address, f"{f_name}.right", (f"{right.inside_address}/32",)))
                elapsed = _floor((s_left, s_right), pool, f_name, f_ends, proposals)
                p_name = f"floor-peered-{i}"
                p_ends = (TunnelEnd(left.ike_address, f"{p_name}.left", (f"{left.inside_address}/32",)),
                          TunnelEnd(right.ike_address, f"{p_name}.right", (f"{right.inside_address}/32",)))
                elapsed_peered_floor = _floor((s_left, s_right), pool, p_name, p_ends, proposals,
                                              one_after_the_other=True)
            if i >= 2:
                floor.append(elapsed * 1000)
                peered_floor.append(elapsed_peered_floor * 1000)
        http: list[float] = []
        for _ in range(50):
            t0 = time.perf_counter()
            if loop.run_until_complete(lean.request("GET", "/livez")).status != 200:
                raise RuntimeError("GET /livez did not answer 200")
            http.append((time.perf_counter() - t0) * 1000)
        http_med = statistics.median(http)
        ours_med, bare_med, floor_med = statistics.median(ours), statistics.median(bare), statistics.median(floor)
        print(f"suite: esp {proposals['esp'] if proposals else '?'}, ike {proposals['ike'] if proposals else '?'}; "
              f"{rounds} rounds each, interleaved")
        print(f"POST /v1/tunnels -> verified up: median {ours_med:.1f} ms, p90 {percentile(ours, 90):.1f} ms")
        httpx_med = statistics.median(with_httpx)
        print(f"  the same, sent by httpx:       median {httpx_med:.1f} ms, p90 {percentile(with_httpx, 90):.1f} ms "
              f"(ratio {httpx_med / statistics.median(bare):.2f})")
        ppk_med = statistics.median(with_ppk)
        print(f"  with a post-quantum minimum (a PPK on both ends): median {ppk_med:.1f} ms, "
              f"p90 {percentile(with_ppk, 90):.1f} ms; the PPK adds {ppk_med - ours_med:+.1f} ms "
              f"({100 * (ppk_med - ours_med) / ours_med:+.0f} %)")
        peered_med = statistics.median(peered)
        print(f"  peered (left -> gw-b@site-b): median {peered_med:.1f} ms, p90 {percentile(peered, 90):.1f} ms; "
              f"peered / local = {peered_med / ours_med:.2f} (goal <= 1.3)")
        print(f"bare VICI initiate:             median {bare_med:.1f} ms, p90 {percentile(bare, 90):.1f} ms")
        bare_ppk_med = statistics.median(bare_ppk)
        print(f"  with a PPK on both ends:      median {bare_ppk_med:.1f} ms, p90 {percentile(bare_ppk, 90):.1f} ms; "
              f"the PPK adds {bare_ppk_med - bare_med:+.1f} ms to charon's work")
        detached_med = statistics.median(detached)
        print(f"  not waiting, until child-updown: median {detached_med:.1f} ms, "
              f"p90 {percentile(detached, 90):.1f} ms (qoss / this: {ours_med / detached_med:.2f})")
        print(f"required steps alone (floor):   median {floor_med:.1f} ms, p90 {percentile(floor, 90):.1f} ms")
        print(f"an HTTP round trip that does nothing (GET /livez, 50): median {http_med:.2f} ms")
        peered_floor_med, sealing_med = statistics.median(peered_floor), _sealing(200)
        least = peered_floor_med + http_med + sealing_med
        print(f"  peered floor: the right end loaded before the left, then as above: median {peered_floor_med:.1f} ms; "
              f"with one HTTP round trip and an offer and an answer sealed and opened ({sealing_med:.2f} ms): "
              f"{least:.1f} ms = {least / ours_med:.2f} x the local set-up, leaving "
              f"{1.3 * ours_med - least:.1f} ms under the 1.3 goal for everything else both services do")
        delete_med, bare_down_med = statistics.median(deletes), statistics.median(bare_down)
        print(f"DELETE /v1/tunnels/{{id}} -> 204: median {delete_med:.1f} ms, p90 {percentile(deletes, 90):.1f} ms; "
              f"bare teardown (terminate, then unload conn and secret on both ends): median {bare_down_med:.1f} ms "
              f"(ratio {delete_med / bare_down_med:.2f})")
        print(f"ratio {ours_med / bare_med:.2f} (goal <= 2.0); the floor alone {floor_med / bare_med:.2f}, "
              f"floor + one HTTP round trip {(floor_med + http_med) / bare_med:.2f}")


if __name__ == "__main__":
    main()
