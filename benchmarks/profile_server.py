"""Where the server's CPU goes while it sets tunnels up: py-spy samples the running ``qoss serve``
(the same lab and server as the other tunnel benchmarks) while clients create and delete tunnels,
and the frames that hold the most samples are printed, by their own time and by their time
including what they call.

    .venv/bin/python -m benchmarks.profile_server [--tunnels 200] [--clients 8] [--rate 250]

py-spy (the ``bench`` extra) attaches to the server's process from outside (root): the server
runs unchanged. Only the thread holding the interpreter lock is sampled (``--gil``): the
figures are where the server's Python spends CPU, not where its threads wait. Prints the ten
frames with most samples of their own, the ten functions of qoss's own code with most samples
including what they call, and the samples by package (each as a share of all samples), and
the server's CPU per tunnel.

Before py-spy attaches, the same load runs once unsampled and the server's CPU per tunnel is
printed by thread (from ``/proc/PID/task``, each thread named as py-spy names it: the event
loop ``MainThread``, the requests' ``AnyIO worker thread``s, the charons' event listeners,
the tunnel monitor, ...): exact CPU, where the samples are a picture of it.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from benchmarks._harness import cpu_seconds, lab_and_service, thread_cpu_seconds

#: ``function (path:line)`` as py-spy writes a frame in its raw (collapsed) output.
_FRAME = re.compile(r"^(?P<fn>.+?) \((?P<path>[^:()]+)(?::\d+)?\)$")


def _short(frame: str) -> str:
    """``function (file)`` with the file relative to its package (lines left out: one row per function)."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m["path"]
    for marker in ("/site-packages/", "/work/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
    for prefix in ("main/", "q/"):
        path = path.removeprefix(prefix)
    return f"{m['fn']} ({path})"


def _package(frame: str) -> str:
    """What a frame belongs to: ``app.<layer>`` for qoss's own code, else the top-level package."""
    m = re.search(r"\(([^()]+)\)$", frame)
    path = m[1] if m else ""
    if path.startswith("app/"):
        return "qoss " + "/".join(path.split("/")[:2]).removesuffix(".py")
    top = path.split("/")[0]
    return top.removesuffix(".py") if top and not top.startswith("<") else "python"


def tally(raw: str) -> tuple[int, collections.Counter[str], collections.Counter[str], collections.Counter[str]]:
    """Of py-spy's raw output: the samples; per frame its own samples; per frame of qoss's own code
    its samples including callees; per package its own samples."""
    own: collections.Counter[str] = collections.Counter()
    ours: collections.Counter[str] = collections.Counter()
    packages: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_short(f) for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        samples += n
        own[frames[-1]] += n
        packages[_package(frames[-1])] += n
        for frame in {f for f in frames if "(app/" in f and "(app/cli/" not in f and "(app/web/server" not in f
                      and "(app/main.py" not in f and "(app/web/observe" not in f}:
            ours[frame] += n
    return samples, own, ours, packages


def _load(base: str, headers: dict[str, str], count: int, clients: int, errors: list[str]) -> None:
    body = {"initiator": "left", "responder": "right", "min_levels": {"confidentiality": 8, "integrity": 8}}
    left = iter(range(count))
    lock = threading.Lock()

    def work() -> None:
        with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
            while True:
                with lock:
                    if next(left, None) is None:
                        return
                r = client.post("/v1/tunnels", json=body)
                if r.status_code != 201:
                    errors.append(f"{r.status_code} {r.text[:120]}")
                    continue
                client.delete(f"/v1/tunnels/{r.json()['id']}")

    threads = [threading.Thread(target=work) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)


_THREAD = re.compile(r'^Thread (?P<id>\S+) \([^)]*\): "(?P<name>[^"]*)"', re.MULTILINE)


def thread_names(dump: str) -> dict[int, str]:
    """Native thread id -> name, from ``py-spy dump``'s lines ``Thread 1234 (idle): "name"``."""
    return {int(m["id"], 0): m["name"] for m in _THREAD.finditer(dump)}


def by_thread(before: dict[int, float], after: dict[int, float], names: dict[int, str]) -> dict[str, float]:
    """CPU seconds spent between two readings, summed by thread name (threads of one pool together;
    a thread py-spy did not name is ``thread <id>``)."""
    spent: dict[str, float] = collections.defaultdict(float)
    for tid, seconds in after.items():
        if seconds > before.get(tid, 0.0):
            spent[names.get(tid, f"thread {tid}")] += seconds - before.get(tid, 0.0)
    return dict(spent)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tunnels", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--raw", type=Path, help="also keep py-spy's raw output (a line per stack, threads named)")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    with lab_and_service() as svc, tempfile.TemporaryDirectory() as tmp:
        _load(svc.base_url, svc.headers, 10, 2, [])  # warm up
        threads0 = thread_cpu_seconds(svc.pid)
        _load(svc.base_url, svc.headers, args.tunnels, args.clients, [])
        threads1 = thread_cpu_seconds(svc.pid)
        names = thread_names(subprocess.run([spy, "dump", "--pid", str(svc.pid)], capture_output=True, text=True,
                                            timeout=60).stdout)
        threads = by_thread(threads0, threads1, names)
        out = Path(tmp) / "profile.txt"
        profiler = subprocess.Popen([spy, "record", "--pid", str(svc.pid), "--format", "raw", "--rate",
                                     str(args.rate), "--gil", "--threads", "--output", str(out)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # attached
        errors: list[str] = []
        cpu0, t0 = cpu_seconds(svc.pid), time.perf_counter()
        _load(svc.base_url, svc.headers, args.tunnels, args.clients, errors)
        cpu, wall = cpu_seconds(svc.pid) - cpu0, time.perf_counter() - t0
        profiler.send_signal(2)  # py-spy writes its output on SIGINT
        _, err = profiler.communicate(timeout=60)
        if not out.exists():
            raise SystemExit(f"py-spy wrote nothing: {err.decode()[-500:]}")
        samples, own, ours, packages = tally(out.read_text())
        if args.raw is not None:
            shutil.copyfile(out, args.raw)
    print(f"{args.tunnels} tunnels (POST + DELETE), {args.clients} clients, {wall:.1f} s; "
          f"server CPU {cpu * 1000 / args.tunnels:.1f} ms per tunnel; {samples} samples; "
          f"{len(errors)} failed" + (f" (first: {errors[0]})" if errors else ""))
    print(f"\nunsampled, the same load: server CPU {sum(threads.values()) * 1000 / args.tunnels:.2f} ms per tunnel, "
          "by thread:")
    for name, seconds in sorted(threads.items(), key=lambda item: -item[1]):
        print(f"  {seconds * 1000 / args.tunnels:6.2f} ms  {name}")
    for title, counter in (("their own time", own),
                           ("time including callees, of qoss's own code past the app's entry", ours),
                           ("own time, summed by package", packages)):
        print(f"\ntop {args.top} by {title} (share of samples):")
        for frame, n in counter.most_common(args.top):
            print(f"  {100 * n / max(samples, 1):5.1f} %  {frame}")
    if errors:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
