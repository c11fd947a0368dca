"""`qoss bench tunnel` for real: one suite, one repetition, about a second of iperf3.

Each test builds its own lab (two charons with kernel-libipsec in network namespaces)
and its own SQLite database, and tears both down.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.unit_of_work import sql_units_of_work
from app.cli.main import app
from app.lab.bench import bench_lab
from app.measure.adapters.micro import machine_id
from app.measure.adapters.tunnel import charon_pids, run_bench
from app.measure.domain.tunnel import SuiteSpec, bench_document
from app.services import gateways
from app.services.ratings import get_table

pytestmark = pytest.mark.charon


def test_one_suite_runs_through_the_service_and_leaves_nothing_behind() -> None:
    suite = SuiteSpec("aes128", "sha256")
    cpu = max(os.sched_getaffinity(0))
    with bench_lab(prefix_hint="qbi") as bl:
        hosts = (bl.initiator, bl.responder)

        def charon_affinities() -> set[frozenset[int]]:
            return {frozenset(os.sched_getaffinity(int(task.name)))
                    for pid in charon_pids(hosts) for task in Path(f"/proc/{pid}/task").iterdir()}

        unpinned = charon_affinities()
        during: list[set[frozenset[int]]] = []
        opener = bl.tunnels(bl.candidates())
        baseline, runs, skipped = run_bench(initiator=bl.initiator, responder=bl.responder, opener=opener,
                                            suites=[suite], repetitions=1, duration=1.0, ping_count=5,
                                            flows=(1,), sizes=(64, 1400), cpus=frozenset({cpu}),
                                            progress=lambda _: during.append(charon_affinities()))
        after = charon_affinities()
        assert len(charon_pids(hosts)) == 2
        gateways = [bl.initiator.gateway(timeout=5.0), bl.responder.gateway(timeout=5.0)]
        left_over = [(g.list_sas(), g.list_conns(), g.get_shared()) for g in gateways]
    assert skipped == {}
    assert [r.spec for r in runs] == [suite]
    (run,) = runs
    assert run.esp == "aes128-sha256"
    assert run.throughput_mbps[0] > 0
    assert baseline.throughput_mbps[0] > 0
    assert set(run.rtt_ms) == {64, 1400}
    assert run.cpu_ns_per_byte[0] > 0  # ESP in charon: it worked for the bytes carried
    # The tunnel really carried the suite: charon's CHILD_SA, read after the traffic.
    (observed,) = run.observed
    assert observed["encr_alg"] == "AES_CBC"
    assert observed["encr_keysize"] == 128
    assert observed["integ_alg"] == "HMAC_SHA2_256_128"
    assert observed["bytes_out"] > 1_000_000
    assert left_over == [([], [], []), ([], [], [])]
    # Every charon thread was on the one CPU while measuring, and is back where it was.
    assert during == [{frozenset({cpu})}, {frozenset({cpu})}]
    assert after == unpinned == {frozenset(os.sched_getaffinity(0))}
    doc = bench_document(machine="m", backend=bl.backend, date="2026-11-23", repetitions=1, duration_s=1.0,
                         baseline=baseline, suites=runs)
    assert doc["backend"] == "kernel-libipsec"
    assert doc["suites"][0]["ike"] == run.ike


def test_the_command_writes_the_document_and_the_measured_table(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the table's YAML goes to ./var/bench
    out = tmp_path / "tunnel.json"
    url = f"sqlite:///{tmp_path}/qoss.db"
    micro = tmp_path / "micro.json"
    micro.write_text(json.dumps({"kind": "qoss-bench-micro", "machine": machine_id(), "results": [
        {"algorithm": "aes128", "ns": {"1400": 1246.4}}, {"algorithm": "sha1", "ns": {"1400": 1298.0}}]}))
    result = CliRunner().invoke(app, ["bench", "tunnel", "--suites", "aes128-sha1", "--repetitions", "1",
                                      "--duration", "1", "--ping-count", "5", "--out", str(out),
                                      "--write-table", "tunnel-test", "--database-url", url, "--micro", str(micro)])
    assert result.exit_code == 0, result.output
    engine = make_engine(url)
    try:
        with sql_units_of_work(make_session_factory(engine))() as uow:
            table = get_table(uow=uow, name="tunnel-test")
            left_behind = (uow.tunnels.list(), gateways.list_gateways(uow=uow))
    finally:
        engine.dispose()
    assert set(table.ratings) == {"aes128", "sha1"}
    aes = table.ratings["aes128"]
    assert aes.confidentiality == 8  # from standards-2026
    assert aes.measurement is not None
    assert aes.measurement.throughput_mbps is not None
    assert aes.measurement.throughput_mbps > 0
    assert aes.measurement.backend == "kernel-libipsec"
    assert "shrunk toward the micro benchmark" in (aes.measurement.method or "")
    assert (tmp_path / "var" / "bench" / "tunnel-test.yaml").exists()
    assert left_behind == ([], [])
    doc = json.loads(out.read_text())
    assert doc["kind"] == "qoss-bench-tunnel"
    assert [s["esp"] for s in doc["suites"]] == ["aes128-sha1"]
    row = doc["suites"][0]
    assert row["throughput_mbps"]["median"] > 0
    assert set(row["parallel_mbps"]) == {"1", "2", "4"}
    assert set(row["rtt_ms"]) == {"64", "300", "700", "1400"}
    assert "aes128-sha1" in result.output


def test_a_suite_the_gateways_cannot_use_is_refused_before_any_lab() -> None:
    result = CliRunner().invoke(app, ["bench", "tunnel", "--suites", "aes128-prfsha1"])
    assert result.exit_code == 2
