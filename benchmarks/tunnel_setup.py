"""Tunnel set-up time: POST /v1/tunnels until verified up, against a bare VICI initiate.

    .venv/bin/python benchmarks/tunnel_setup.py [--rounds 20]

Same run, same lab (two charons, kernel-libipsec, network namespaces), same suite:
- qoss: POST /v1/tunnels -> 201 (negotiate, load secret+conn on both ends, initiate,
  list-sas on both ends verified), timed by the client; then DELETE (not timed).
- bare: the same conn and secret loaded beforehand (not timed), then only VICI
  ``initiate`` timed; then terminate and unload (not timed).
Prints the medians and the ratio. Goal: qoss <= 1.25 x bare.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time

import httpx

from app.adapters.vici.driver import ViciGateway
from app.domain.tunnels import TunnelEnd, conn_payload
from benchmarks._harness import lab_and_service, percentile


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with lab_and_service() as svc, httpx.Client(base_url=svc.base_url, timeout=30, headers=svc.headers) as client:
        left, right = svc.lab.host("left"), svc.lab.host("right")
        body = {"initiator": "left", "responder": "right", "min_levels": {"confidentiality": 8, "integrity": 8}}
        ours: list[float] = []
        bare: list[float] = []
        proposals = None
        for i in range(args.rounds + 2):  # two warm-up rounds
            t0 = time.perf_counter()
            r = client.post("/v1/tunnels", json=body)
            elapsed = time.perf_counter() - t0
            r.raise_for_status()
            tunnel = r.json()
            proposals = tunnel["proposals"]
            client.delete(f"/v1/tunnels/{tunnel['id']}").raise_for_status()
            if i >= 2:
                ours.append(elapsed * 1000)

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
            gws[0].terminate(ike=name, force=True)
            for gw in gws:
                gw.unload_conn(name)
                gw.unload_shared(name)
        ours_med, bare_med = statistics.median(ours), statistics.median(bare)
        print(f"suite: esp {proposals['esp'] if proposals else '?'}, ike {proposals['ike'] if proposals else '?'}; "
              f"{args.rounds} rounds each, interleaved")
        print(f"POST /v1/tunnels -> verified up: median {ours_med:.1f} ms, p90 {percentile(ours, 90):.1f} ms")
        print(f"bare VICI initiate:             median {bare_med:.1f} ms, p90 {percentile(bare, 90):.1f} ms")
        print(f"ratio {ours_med / bare_med:.2f} (goal <= 1.25)")


if __name__ == "__main__":
    main()
