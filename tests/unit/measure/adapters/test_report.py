"""`qoss bench report`: files written from recorded runs, and a short real micro run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli.main import app
from app.domain.errors import InvalidInput
from app.measure.adapters.report import cpu_flags, write_report

DATA = Path(__file__).parent / "data"
PNG = b"\x89PNG\r\n\x1a\n"


def _assert_small_pngs(paths: tuple[Path, ...] | list[Path]) -> None:
    for path in paths:
        data = path.read_bytes()
        assert data.startswith(PNG), path
        assert 5_000 < len(data) < 200_000, (path, len(data))


def test_report_from_recorded_micro_and_tunnel(tmp_path: Path) -> None:
    report = write_report(micro_path=DATA / "micro_recorded.json", tunnel_path=DATA / "tunnel_lab_first.json",
                          out_dir=tmp_path / "out", commands=["qoss bench report (test)"],
                          levels={"3des": 3}, flags=frozenset({"aes", "sha_ni"}))
    assert report.markdown == tmp_path / "out" / "report.md"
    assert sorted(p.name for p in report.plots) == ["kex.png", "latency_fit.png", "throughput_micro.png",
                                                   "throughput_tunnel.png"]
    _assert_small_pngs(report.plots)
    text = report.markdown.read_text()
    for plot in report.plots:
        assert f"]({plot.name})" in text
    assert "## Tunnel (real charon" in text
    assert "| aes128gcm16 | aes128-sha256-x25519 | 463 |" in text
    assert "qoss bench report (test)" in text
    # Every seed table against the micro; against the tunnel where it has two rows or more.
    sources = [(c.table.key, c.source) for c in report.comparisons]
    assert ("000-T10", "tunnel") in sources
    assert ("000-T8", "tunnel") not in sources  # the tunnel run has no ESP suite of a cipher alone
    assert len([s for s in sources if s[1] == "micro"]) == 5
    sha = next(c for c in report.comparisons if c.table.key == "000-T14-auth")
    assert len(sha.flips) == 2
    assert "HMAC-SHA-1 > HMAC-MD5" in text


def test_report_of_a_pinned_tunnel_run_says_so(tmp_path: Path) -> None:
    doc = json.loads((DATA / "tunnel_lab_first.json").read_text())
    (tmp_path / "pinned.json").write_text(json.dumps({**doc, "cpus": [1]}))
    report = write_report(micro_path=DATA / "micro_recorded.json", tunnel_path=tmp_path / "pinned.json",
                          out_dir=tmp_path / "out", flags=frozenset())
    assert "; charons, iperf3 and ping pinned to CPU 1" in report.markdown.read_text()
    _assert_small_pngs(report.plots)


def test_report_without_tunnel_has_no_tunnel_part(tmp_path: Path) -> None:
    report = write_report(micro_path=DATA / "micro_recorded.json", out_dir=tmp_path, flags=frozenset())
    assert len(report.plots) == 3
    text = report.markdown.read_text()
    assert "## Tunnel" not in text
    assert "against the tunnel" not in text


def test_unreadable_input_is_an_invalid_input(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="cannot read"):
        write_report(micro_path=tmp_path / "missing.json", out_dir=tmp_path)
    (tmp_path / "t.json").write_text(json.dumps({"kind": "something-else"}))
    with pytest.raises(InvalidInput, match="kind"):
        write_report(micro_path=DATA / "micro_recorded.json", tunnel_path=tmp_path / "t.json", out_dir=tmp_path)


def test_cpu_flags_come_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu aes sha_ni avx2\n")
    assert cpu_flags(info) == {"fpu", "aes", "sha_ni", "avx2"}
    assert cpu_flags(tmp_path / "none") == frozenset()


def test_short_real_micro_then_report_through_the_cli(tmp_path: Path) -> None:
    runner = CliRunner()
    micro = tmp_path / "micro.json"
    result = runner.invoke(app, ["bench", "micro", "--only", "aes128,md5,sha1,sha256,modp2048,x25519",
                                 "--budget", "0.1", "--repeat", "2", "--out", str(micro)])
    assert result.exit_code == 0, result.output
    doc = json.loads(micro.read_text())
    assert doc["kind"] == "qoss-bench-micro"
    assert {r["algorithm"] for r in doc["results"]} == {"aes128", "md5", "sha1", "sha256", "modp2048", "x25519"}
    assert doc["command"].startswith("qoss bench micro --budget 0.1 --only aes128,md5")
    assert doc["repeat"] == 2
    result = runner.invoke(app, ["bench", "report", "--micro", str(micro), "--out", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    written = json.loads(result.output)
    assert Path(written["report"]).is_file()
    _assert_small_pngs([Path(p) for p in written["plots"]])
    text = Path(written["report"]).read_text()
    assert "| modp2048 |" in text
    assert doc["command"] in text
    assert "#### Niedermayer et al. Table 14: ESAF performance levels, authentication — against the micro" in text


def test_report_command_refuses_a_bad_document(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    result = CliRunner().invoke(app, ["bench", "report", "--micro", str(bad), "--out", str(tmp_path)])
    assert result.exit_code == 2
