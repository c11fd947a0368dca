"""The tunnel benchmark: the CPU set it checks before any lab, and its micro-benchmark prior
(reading the document)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli.main import app
from app.lab.bench import read_micro_prior
from app.lab.hosts import LabHost
from app.measure.adapters.traffic import BenchError
from app.measure.adapters.tunnel import OpenTunnel, run_bench
from app.measure.domain.tunnel import SuiteSpec

ALLOWED = frozenset(os.sched_getaffinity(0))


class _NoTunnels:
    def open(self, suite: SuiteSpec) -> OpenTunnel:
        raise AssertionError("no tunnel may be opened")

    def close(self, tunnel: OpenTunnel) -> None:
        raise AssertionError("no tunnel may be closed")


def test_the_bench_checks_the_cpu_set_and_needs_charons_to_pin() -> None:
    host = LabHost("left", "qoss-no-such-netns", "/nonexistent", "10.99.0.1", "10.1.0.1", "/nonexistent")

    def bench(cpus: frozenset[int]) -> None:
        run_bench(initiator=host, responder=host, opener=_NoTunnels(), suites=[SuiteSpec("aes128", "sha1")],
                  repetitions=1, duration=1.0, cpus=cpus)

    with pytest.raises(ValueError, match="empty"):
        bench(frozenset())
    with pytest.raises(ValueError, match="not usable"):
        bench(frozenset({4096}))
    with pytest.raises(BenchError, match="no charon running in qoss-no-such-netns"):
        bench(frozenset({min(ALLOWED)}))


# --------------------------------------------------------------------------- the micro benchmark as prior


def _micro_doc(path: Path, machine: str, results: list[dict[str, object]] | None = None) -> Path:
    path.write_text(json.dumps({"kind": "qoss-bench-micro", "machine": machine, "results": results if results
                                is not None else [{"algorithm": "aes128gcm16", "ns": {"1400": 830.0}},
                                                  {"algorithm": "x25519", "ns_per_op": 52000.0}]}))
    return path


def test_a_micro_document_of_this_machine_gives_ns_per_byte_per_transform(tmp_path: Path) -> None:
    prior = read_micro_prior(_micro_doc(tmp_path / "m.json", "this one"), "this one")
    assert prior == {"aes128gcm16": pytest.approx(830 / 1400)}


@pytest.mark.parametrize(("content", "says"), [
    (None, "cannot read"), ("{", "cannot read"), ('{"kind": "qoss-bench-tunnel", "results": []}', "is not a"),
    ('{"kind": "qoss-bench-micro", "machine": "other", "results": []}', "measured on 'other'"),
    ('{"kind": "qoss-bench-micro", "machine": "this one", "results": [{"algorithm": "x25519"}]}', "no per-byte"),
])
def test_what_is_not_a_micro_document_of_this_machine_is_refused(tmp_path: Path, content: str | None,
                                                                  says: str) -> None:
    path = tmp_path / "m.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=says):
        read_micro_prior(path, "this one")


def test_the_command_refuses_a_micro_prior_it_cannot_use_before_any_lab(tmp_path: Path) -> None:
    doc = _micro_doc(tmp_path / "m.json", "another machine")
    alone = CliRunner().invoke(app, ["bench", "tunnel", "--suites", "aes128gcm16", "--micro", str(doc)])
    assert alone.exit_code == 2
    assert "give both" in alone.output
    foreign = CliRunner().invoke(app, ["bench", "tunnel", "--suites", "aes128gcm16", "--micro", str(doc),
                                       "--write-table", "t"])
    assert foreign.exit_code == 2
    assert "measured on 'another machine'" in foreign.output
