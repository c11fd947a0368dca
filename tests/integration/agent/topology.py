"""Client, Host and Target in three network namespaces, each role its own process.

``client`` has a charon and runs ``qoss agent`` commands; ``host`` runs ``qoss serve`` as
Host; ``target`` runs ``qoss serve`` as Target with its charon. The servers listen on the
lab's IKE network (10.99.0.x), reachable only inside the namespaces. Used by the
end-to-end test and by ``benchmarks/agent_join.py``; always torn down by ``close``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from app.adapters.lab import Lab, LabHost

REPO = Path(__file__).resolve().parents[3]
QOSS = str(Path(sys.executable).parent / "qoss")
PORT = 8400
POOL = "10.8.0.0/28"


class Topology:
    """Build with :meth:`open`; ``close`` stops the servers and removes the lab, whatever happened."""

    def __init__(self, server_env: dict[str, str] | None = None, *, combined: bool = False) -> None:
        """``combined``: one ``qoss serve`` in the target namespace plays Host and Target (the
        config's ``url: local``), so a request makes one HTTP hop instead of two."""
        self.server_env = server_env or {}
        self.combined = combined
        self.dir = Path(tempfile.mkdtemp(prefix="qoss-agent-", dir="/tmp"))
        self.lab = Lab(self.dir / "lab", prefix=f"qe{os.getpid() % 100000}-{uuid.uuid4().hex[:4]}")
        self.servers: list[subprocess.Popen[bytes]] = []

    @property
    def client(self) -> LabHost:
        return self.lab.host("client")

    @property
    def host(self) -> LabHost:
        return self.lab.host("host")

    @property
    def target(self) -> LabHost:
        return self.lab.host("target")

    def url(self, h: LabHost) -> str:
        return f"http://{h.ike_address}:{PORT}"

    def qoss(self, *args: str, netns: str | None = None, check: bool = True,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [QOSS, *args]
        if netns is not None:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False,
                              env={**os.environ, **(env or {})}, cwd=REPO)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {done.stderr[-2000:]}")
        return done

    def open(self) -> Topology:
        self.lab.up(names=["client", "host", "target"])
        keys = self.dir / "keys"
        host_id = "target-1" if self.combined else "host-1"
        for name in (["target-1", "alice"] if self.combined else ["host-1", "target-1", "alice"]):
            self.qoss("agent", "keygen", name, "--dir", str(keys))
        target_role = {"hosts": {host_id: {"public_key_file": str(keys / f"{host_id}.pub.json")}},
                       "vici_socket": self.target.vici_socket, "ike_address": self.target.ike_address,
                       "protected": [f"{self.target.inside_address}/32"], "pool": POOL, "sweep_interval": 0.5}
        if self.combined:
            (self.dir / "target.yaml").write_text(yaml.safe_dump({
                "id": "target-1", "key_dir": str(keys), "target": target_role,
                "host": {"targets": {"target-1": {"url": "local",
                                                  "public_key_file": str(keys / "target-1.pub.json")}}},
            }))
        else:
            (self.dir / "host.yaml").write_text(yaml.safe_dump({
                "id": "host-1", "key_dir": str(keys),
                "host": {"targets": {"target-1": {"url": self.url(self.target),
                                                  "public_key_file": str(keys / "target-1.pub.json")}}},
            }))
            (self.dir / "target.yaml").write_text(yaml.safe_dump({
                "id": "target-1", "key_dir": str(keys), "target": target_role}))
        host = self.target if self.combined else self.host
        (self.dir / "client.yaml").write_text(yaml.safe_dump({
            "user": "alice", "key_dir": str(keys),
            "host": {"id": host_id, "url": self.url(host), "public_key_file": str(keys / f"{host_id}.pub.json")},
            "targets": {"target-1": {"public_key_file": str(keys / "target-1.pub.json")}},
            "vici_socket": self.client.vici_socket, "state_dir": str(self.dir / "client-state"),
            "ike_address": self.client.ike_address,
        }))
        host_role = "target" if self.combined else "host"
        self.qoss("db", "upgrade", "--database-url", self.db(host_role))
        self.qoss("agent", "enroll", str(keys / "alice.pub.json"), "--objective", "3", "--objective", "2",
                  "--database-url", self.db(host_role))
        roles = [("target", self.target)] if self.combined else [("target", self.target), ("host", self.host)]
        for role, h in roles:
            self._serve(role, h)
        for _, h in roles:
            self._wait(h)
        return self

    def db(self, role: str) -> str:
        return f"sqlite:///{self.dir}/{role}.db"

    def _serve(self, role: str, h: LabHost) -> None:
        env = {**os.environ, "QOSS_DATABASE_URL": self.db(role), "QOSS_AGENT_CONFIG": str(self.dir / f"{role}.yaml"),
               "QOSS_RECONCILE_ON_START": "false", "QOSS_LOG_LEVEL": "warning", **self.server_env}
        with open(self.dir / f"{role}.log", "ab") as log:  # the server keeps its own copy of the fd
            self.servers.append(subprocess.Popen(
                ["ip", "netns", "exec", h.netns, QOSS, "serve", "--host", h.ike_address, "--port", str(PORT)],
                env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO,
            ))

    def _wait(self, h: LabHost, timeout: float = 60.0) -> None:
        probe = "import httpx,sys; sys.exit(httpx.get(sys.argv[1], timeout=1).status_code != 200)"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = subprocess.run(["ip", "netns", "exec", self.client.netns, sys.executable, "-c", probe,
                                   f"{self.url(h)}/healthz"], capture_output=True, timeout=30, check=False)
            if done.returncode == 0:
                return
            if any(s.poll() is not None for s in self.servers):
                break
            time.sleep(0.3)
        logs = {p.name: p.read_text()[-2000:] for p in self.dir.glob("*.log")}
        raise RuntimeError(f"server at {self.url(h)} did not come up: {logs}")

    def agent(self, *args: str, check: bool = True) -> Any:
        """``qoss agent <args> --config client.yaml`` in the client's namespace; its JSON."""
        done = self.qoss("agent", *args, "--config", str(self.dir / "client.yaml"), netns=self.client.netns,
                         check=check)
        return json.loads(done.stdout) if done.returncode == 0 else done

    def close(self) -> None:
        for server in self.servers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)
        for server in self.servers:
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=5)
        try:
            self.lab.down()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
