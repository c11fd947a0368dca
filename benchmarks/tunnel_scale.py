"""1,000 tunnels on one gateway pair through the API: set-up p50/p99 and the service's memory.

    .venv/bin/python benchmarks/tunnel_scale.py [--tunnels 1000] [--budget 600]

Each tunnel protects a distinct /32 on the left (10.10.x.y) to the right's inside
address. Two cycles of bring-all-up / tear-all-down; prints set-up p50/p99 and the
service's RSS with all tunnels up and after each teardown (flat = the second cycle ends
where the first did). Goals: p99 <= 50 ms; memory flat after teardown.
Bounded by count and by the time budget (seconds).
"""

from __future__ import annotations

import argparse
import statistics
import time

import httpx

from benchmarks._harness import all_tunnels, lab_and_service, left_sources, percentile


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tunnels", type=int, default=1000)
    parser.add_argument("--budget", type=float, default=900.0)
    parser.add_argument("--cycles", type=int, default=2, help="memory is flat if RSS after teardown stays level")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget
    with lab_and_service() as svc, httpx.Client(base_url=svc.base_url, timeout=60, headers=svc.headers) as client:
        right = svc.lab.host("right")
        sources = left_sources(svc, args.tunnels)
        # Warm up the service (imports, caches) before the baseline reading.
        for _ in range(5):
            r = client.post("/v1/tunnels", json={"initiator": "left", "responder": "right"})
            r.raise_for_status()
            client.delete(f"/v1/tunnels/{r.json()['id']}").raise_for_status()
        rss_before = svc.rss_kib()
        print(f"service RSS before: {rss_before / 1024:.1f} MiB")
        for cycle in range(1, args.cycles + 1):
            times: list[float] = []
            ids: list[str] = []
            failures: list[str] = []
            for i in range(args.tunnels):
                if time.monotonic() > deadline:
                    print(f"time budget reached after {i} tunnels")
                    break
                body = {"initiator": "left", "responder": "right", "local_ts": [f"{sources[i]}/32"],
                        "remote_ts": [f"{right.inside_address}/32"]}
                t0 = time.perf_counter()
                r = client.post("/v1/tunnels", json=body)
                times.append((time.perf_counter() - t0) * 1000)
                if r.status_code != 201:
                    failures.append(f"tunnel {i}: {r.status_code} {r.json().get('detail')}")
                    if len(failures) >= 20:
                        print("20 failures: stopping")
                        break
                    continue
                ids.append(r.json()["id"])
            rss_up = svc.rss_kib()
            listed = len(all_tunnels(client)[0])
            t0 = time.perf_counter()
            for tunnel_id in ids:
                client.delete(f"/v1/tunnels/{tunnel_id}").raise_for_status()
            teardown = time.perf_counter() - t0
            rss_after = svc.rss_kib()
            print(f"cycle {cycle}: {len(ids)} tunnels up (listed {listed}), {len(failures)} failed; set-up "
                  f"p50 {statistics.median(times):.1f} ms, p99 {percentile(times, 99):.1f} ms, "
                  f"max {max(times):.1f} ms (goal p99 <= 50 ms); teardown {teardown:.1f} s; "
                  f"RSS all up {rss_up / 1024:.1f} MiB, after teardown {rss_after / 1024:.1f} MiB")
            for line in failures[:5]:
                print("  " + line[:300])


if __name__ == "__main__":
    main()
