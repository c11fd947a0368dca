"""An edit that leaves every running tunnel below its minimum: how long until all are
compliant again, moved make-before-break, against tearing them all down and bringing them up.

    .venv/bin/python benchmarks/rekey_scale.py [--tunnels 1000] [--sample 3] [--budget 1200] [--settle 1]

A real ``qoss serve`` and two charons (kernel-libipsec) in network namespaces. Each tunnel
protects its own /32 on the left (10.10.x.y) to the right's inside address and asks for
confidentiality and integrity 8, which the shipped table meets cheapest with aes128gcm16.
A dry run of the edit first (it must name every tunnel noncompliant); then, with ``ping -i
0.05`` running through a sample of the tunnels, PATCH aes128gcm16's confidentiality to 5 and
wait until every tunnel reports its new suite. The same tunnels are then, for comparison,
deleted and created again one by one (what an operator would do without qoss), with the same
pings running (alone for ``--settle`` seconds before and after each way). The right host
drops ICMP that arrives in clear text, so a ping counts only if a tunnel carried it. Prints
both times, the ratio, the packets the sample lost in each, and the service's CPU seconds and
RSS. Bounded by count and by the time budget (seconds).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import time
from pathlib import Path

import httpx

from app.lab.network import IKE_INTERFACE
from benchmarks._harness import all_tunnels, lab_and_service, left_sources

TABLE = "/v1/rating-tables/standards-2026"
LEVELS = {"confidentiality": 8, "integrity": 8}


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks of 1/100 s


def _pings(netns: str, sources: list[str], target: str, seconds: float) -> list[subprocess.Popen[str]]:
    count = str(int(seconds / 0.05))
    return [subprocess.Popen(["ip", "netns", "exec", netns, "ping", "-q", "-i", "0.05", "-c", count, "-W", "1",
                              "-I", src, target], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for src in sources]


def _lost(pings: list[subprocess.Popen[str]]) -> list[str]:
    out = []
    for p in pings:
        p.send_signal(signal.SIGINT)  # ping prints its statistics on SIGINT
        text = p.communicate(timeout=30)[0]
        line = next((x for x in text.splitlines() if "packet loss" in x), text.strip()[-80:])
        out.append(line.split(", time")[0])
    return out


def _revision(client: httpx.Client) -> str:
    return client.get(TABLE).headers["ETag"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tunnels", type=int, default=1000)
    parser.add_argument("--sample", type=int, default=3, help="tunnels with a ping running through them")
    parser.add_argument("--budget", type=float, default=1200.0)
    parser.add_argument("--settle", type=float, default=1.0,
                        help="seconds the pings run alone before and after each way (default 1)")
    args = parser.parse_args()
    settle = max(0.0, args.settle)
    deadline = time.monotonic() + args.budget
    with lab_and_service() as svc, httpx.Client(base_url=svc.base_url, timeout=120, headers=svc.headers) as client:
        left, right = svc.lab.host("left"), svc.lab.host("right")
        addresses = left_sources(svc, args.tunnels)
        # A ping that finds no SA would cross the link in clear text and still be answered:
        # the right host drops clear ICMP, so only pings the tunnels carried count.
        subprocess.run(["ip", "netns", "exec", right.netns, "iptables", "-A", "INPUT", "-i", IKE_INTERFACE, "-p",
                        "icmp", "-j", "DROP"], check=True, timeout=30)

        def create(i: int) -> str:
            r = client.post("/v1/tunnels", json={"initiator": "left", "responder": "right", "min_levels": LEVELS,
                                                 "local_ts": [f"{addresses[i]}/32"],
                                                 "remote_ts": [f"{right.inside_address}/32"]})
            r.raise_for_status()
            return str(r.json()["id"])

        t0 = time.perf_counter()
        ids = []
        for i in range(args.tunnels):
            if time.monotonic() > deadline:
                print(f"time budget reached after {i} tunnels")
                break
            ids.append(create(i))
        print(f"{len(ids)} tunnels up in {time.perf_counter() - t0:.1f} s (aes128gcm16)")
        edit = {"confidentiality": 5, "reason": "benchmark: weakened"}
        path = f"{TABLE}/ratings/aes128gcm16"
        t0 = time.perf_counter()
        dry = client.patch(path, params={"dry_run": "true"}, json=edit, headers={"If-Match": _revision(client)})
        dry.raise_for_status()
        kinds = [i["kind"] for i in dry.json()["impact"]]
        print(f"dry run: {kinds.count('noncompliant')} of {len(kinds)} tunnels noncompliant "
              f"({time.perf_counter() - t0:.2f} s)")

        sources = addresses[:min(args.sample, len(ids))]
        seconds = 30 + len(ids) * 0.05
        rss0, cpu0 = svc.rss_kib(), _cpu_seconds(svc.pid)
        pings = _pings(left.netns, sources, right.inside_address, seconds)
        time.sleep(settle)
        t0 = time.perf_counter()
        client.patch(path, json=edit, headers={"If-Match": _revision(client)}).raise_for_status()
        pending = set(ids)
        while pending and time.monotonic() < deadline:
            listed = all_tunnels(client)[0]
            pending = {t["id"] for t in listed if t["id"] in pending and t["state"] != "noncompliant"
                       and t["proposals"]["esp"].startswith("aes128gcm")}
            time.sleep(0.2)
        moved_in = time.perf_counter() - t0
        time.sleep(settle)
        lost_move = _lost(pings)
        cpu_move, rss_move = _cpu_seconds(svc.pid) - cpu0, svc.rss_kib()
        listed = all_tunnels(client)[0]
        states = [t["state"] for t in listed]
        for t in [t for t in listed if t["state"] != "up"][:3]:
            print(f"  not moved: {t['id']} {t['state']}: {t['detail'][:300]}")
        print(f"move: {states.count('up')} of {len(ids)} compliant again in {moved_in:.1f} s "
              f"({states.count('up')} up, {states.count('noncompliant')} noncompliant); service CPU {cpu_move:.1f} s, "
              f"RSS {rss0 / 1024:.0f} -> {rss_move / 1024:.0f} MiB; sample pings: {lost_move}")

        cpu0 = _cpu_seconds(svc.pid)
        pings = _pings(left.netns, sources, right.inside_address, seconds * 3)
        time.sleep(settle)
        t0 = time.perf_counter()
        for i, tunnel_id in enumerate(ids):
            if time.monotonic() > deadline:
                print(f"time budget reached after re-creating {i} tunnels")
                break
            client.delete(f"/v1/tunnels/{tunnel_id}").raise_for_status()
            create(i)
        recreated_in = time.perf_counter() - t0
        time.sleep(settle)
        lost_recreate = _lost(pings)
        print(f"delete + create: {len(ids)} tunnels in {recreated_in:.1f} s; service CPU "
              f"{_cpu_seconds(svc.pid) - cpu0:.1f} s; sample pings: {lost_recreate}")
        print(f"ratio move / (delete + create): {moved_in / recreated_in:.2f}")


if __name__ == "__main__":
    main()
