"""Choice quality: does the negotiated suite run as fast as the best feasible one, through real tunnels?

    .venv/bin/python benchmarks/choice_quality.py [--table NAME|FILE.yaml] [--repetitions 5] [--duration 1] \
        [--cpus 1] [--micro FILE | --no-prior] [--save FILE | --from FILE]

One lab (two charons, kernel-libipsec, network namespaces), one throw-away database, one run:
1. A measured table: unless ``--table`` is given, every suite of the default star
   (``app.measure.domain.tunnel.default_suites``) is measured through real tunnels
   (iperf3, ``--table-repetitions`` interleaved) and turned into a rating table exactly
   as ``qoss bench tunnel --write-table --micro`` does (levels from standards-2026), with
   the micro benchmark of the candidate transforms, measured first in the same run (or
   ``--micro FILE``), as prior: suites tied within the noise of the tunnel samples are
   ordered by their crypto cost (``app.measure.domain.tunnel.shrink_to_prior``; ``--no-prior``: medians alone).
2. For each requirement vector (12, from C1/I1/K1 to C10/I10/K9) the tunnel service
   negotiates with that table and brings the chosen suite up (``create_tunnel``, the API's
   code); every suite of the star (plus the chosen one) is checked for feasibility under
   the same minimums through the same negotiation (pinned with ``forbids``).
3. Every suite that is chosen or feasible for some vector, and strongSwan's default ESP
   proposal, is measured again through real tunnels: ``--repetitions`` interleaved
   rounds of iperf3 (``--duration`` s, one TCP flow), median per suite.
4. Per vector: chosen/best (best = the feasible suite of highest median) and, where the
   default proposal meets the minimums, chosen/default. The worst chosen/best is the
   figure of merit (goal >= 0.97; never below the default). It is conservative: the best
   of ~40 noisy medians is biased upwards (the winner's curse), so each vector also shows
   ``cv``, the same ratio with the best picked on the other half of the rounds than it is
   compared on (:func:`cross_validated`: unbiased, noisier, may exceed 1); the same-round
   comparison with the best of the medians and in how many rounds the chosen suite was at
   least as fast; the CPU view: both charons' CPU time per byte (kernel-libipsec does
   ESP in charon), cheapest feasible / chosen; and ``perfect``: the ratio of medians a
   choice exactly as fast as the best would score with this run's noise
   (:func:`perfect_choice`), i.e. how far the figure of merit itself can see here.

``--save FILE`` writes the run's data (every round of every suite, the choices); ``--from
FILE`` prints the report of such a file again without measuring.

``--cpus 1`` (or ``0,1``) pins both charons (every thread), iperf3 and ping to those CPUs
for both measurements (``run_bench(cpus=...)``): on a small shared machine throughput
then reflects each suite's CPU cost rather than where the scheduler put the processes.

strongSwan 5.9's default ESP proposal is AES-CBC 128/192/256 with HMAC-SHA2-256/384/512,
HMAC-SHA1-96 and AES-XCBC-96, and no AEAD ("we currently don't include any AEAD proposal
for ESP, as we don't know if our kernel backend actually supports it"):
``proposal_create_default(PROTO_ESP)`` and ``proposal_create_default_aead(PROTO_ESP)`` in
strongswan/strongswan ``src/libstrongswan/crypto/proposal/proposal.c``; ipsec.conf(5):
"esp ... Defaults to aes128-sha256". This script also checks it on the lab: both ends
load ``esp_proposals = default`` and the CHILD_SA charon negotiates is read back.
Everything is bounded (subprocess timeouts, fixed repetitions) and torn down on exit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.adapters.db.unit_of_work import SqlUnitOfWork  # noqa: E402
from app.adapters.files import parse_rating_table_yaml  # noqa: E402
from app.domain.errors import GatewayError, NegotiationError  # noqa: E402
from app.domain.negotiation import Backend  # noqa: E402
from app.domain.policies import Levels  # noqa: E402
from app.domain.requests import NegotiationSpec, PeerSpec  # noqa: E402
from app.domain.tunnels import TunnelEnd, conn_payload  # noqa: E402
from app.lab.bench import BenchLab, bench_lab, read_micro_prior  # noqa: E402
from app.measure.adapters.micro import KERNELS, machine_id, run_micro  # noqa: E402
from app.measure.adapters.pinning import parse_cpus  # noqa: E402
from app.measure.adapters.traffic import BenchError  # noqa: E402
from app.measure.adapters.tunnel import run_bench  # noqa: E402
from app.measure.domain.report import pinning  # noqa: E402
from app.measure.domain.tunnel import (  # noqa: E402
    SuiteSpec,
    default_suites,
    micro_prior,
    parse_suite,
    pin_attempts,
    pooled_log_sd,
    summarize,
    tunnel_table,
)
from app.services.negotiation import run_negotiation  # noqa: E402
from app.services.ratings import get_table, import_table  # noqa: E402

#: Requirement vectors (confidentiality, integrity, key exchange), low to high.
VECTORS: list[tuple[int, int, int]] = [
    (1, 1, 1), (2, 2, 2), (3, 3, 3), (4, 4, 4), (5, 5, 5), (6, 6, 6), (7, 7, 7), (8, 5, 5), (8, 8, 8), (9, 8, 8),
    (10, 8, 9), (10, 10, 9),
]
DEFAULT_FALLBACK = SuiteSpec("aes128", "sha256")
#: The issue's goal for the worst chosen/best.
GOAL = 0.97
BASE = "standards-2026"


def _prior(candidates: list[str]) -> dict[str, float]:
    """Per-transform ns/byte at 1400 B of the micro benchmark, measured now for every candidate it can measure."""
    keywords = [k for k in candidates if k in KERNELS]
    print(f"micro benchmark of {len(keywords)} transforms (the table's prior)", file=sys.stderr)
    results = run_micro(keywords)
    return micro_prior({"algorithm": r.keyword, "ns": {str(k): v for k, v in r.ns_by_size.items()}} for r in results)


def _table(bl: BenchLab, args: argparse.Namespace, suites: list[SuiteSpec], prior: dict[str, float] | None) -> str:
    """The negotiating table's name in the bench database: given, or measured now."""
    if args.table and not args.table.endswith((".yaml", ".yml")):
        return str(args.table)
    with SqlUnitOfWork(bl.sessions(), owned=True) as uow:
        if args.table:
            table = parse_rating_table_yaml(Path(args.table).read_text())
        else:
            print(f"measuring the table: {len(suites)} suites x {args.table_repetitions} x "
                  f"{args.table_duration:g} s", file=sys.stderr)
            _, runs, skipped = run_bench(initiator=bl.initiator, responder=bl.responder,
                                         opener=bl.tunnels(bl.candidates()), suites=suites,
                                         repetitions=args.table_repetitions, duration=args.table_duration,
                                         flows=(1,), sizes=(), baseline=False, cpus=args.cpus)
            for name, reason in skipped.items():
                print(f"  table: skipped {name}: {reason}", file=sys.stderr)
            table = tunnel_table(name="choice-measured", base=get_table(uow=uow, name=BASE), runs=runs,
                                 machine=machine_id(), backend=bl.backend, date=time.strftime("%Y-%m-%d"),
                                 prior=prior)
        imported = import_table(uow=uow, table=table, fmt="yaml", author="bench")
        uow.commit()
    return imported.name


def _feasible(bl: BenchLab, table: str, suite: SuiteSpec, levels: Levels, candidates: list[str]) -> bool:
    """Whether the tunnel negotiation (same peers as ``create_tunnel``) can be pinned to ``suite``."""
    left, right = bl.gateways
    with SqlUnitOfWork(bl.sessions(), owned=True) as uow:
        for pin in pin_attempts(suite, candidates):
            body = NegotiationSpec(
                rating_table=table, backend=Backend(name=bl.backend, ah=False, ah_esp_bundle=False, transport=False),
                peers=(PeerSpec(name=f"gw-{left.name}", supports=tuple(sorted(left.algorithms))),
                       PeerSpec(name=f"gw-{right.name}", supports=tuple(sorted(right.algorithms))),
                       PeerSpec(name="request", min_levels=levels, forbids=tuple(pin.forbids),
                                objective_id=pin.objective_id)))
            try:
                result = run_negotiation(uow=uow, request=body, default_table=bl.settings.default_table)
            except NegotiationError:
                continue
            s = result.suite
            if s.encryption is not None and SuiteSpec(s.encryption, None if s.aead else s.integrity) == suite:
                return True
    return False


def _strongswan_default(bl: BenchLab) -> SuiteSpec:
    """The ESP suite two charons agree on with ``esp_proposals = default`` on both ends."""
    left, right = bl.initiator, bl.responder
    name = "bench-default"
    psk = secrets.token_bytes(32)
    ends = (TunnelEnd(left.ike_address, f"{name}.left", (f"{left.inside_address}/32",)),
            TunnelEnd(right.ike_address, f"{name}.right", (f"{right.inside_address}/32",)))
    gws = (left.gateway(timeout=10.0), right.gateway(timeout=10.0))
    try:
        for gw, (local, remote) in ((gws[1], (ends[1], ends[0])), (gws[0], ends)):
            gw.load_shared(name, psk, [local.identity, remote.identity])
            gw.load_conn(name, conn_payload(name=name, local=local, remote=remote, ike_proposal="default",
                                            esp_proposal="default", ah_proposal=None, mode="tunnel",
                                            ike_lifetime=3600, child_lifetime=1200))
        gws[0].initiate(child=name, ike=name, timeout_ms=10_000)
        child = next(c for sa in gws[0].list_sas(ike=name) for c in sa.children if c.name == name)
    finally:
        for gw in gws:
            with contextlib.suppress(GatewayError):  # "no matching SAs": nothing up
                gw.terminate(ike=name, timeout_ms=3000, force=True)
            with contextlib.suppress(GatewayError):
                gw.unload_conn(name)
            with contextlib.suppress(GatewayError):
                gw.unload_shared(name)
    by_sa = {("AES_CBC", 128, "HMAC_SHA2_256_128"): DEFAULT_FALLBACK}
    found = by_sa.get((child.encr_alg or "", child.encr_keysize or 0, child.integ_alg or ""))
    if found is None:
        raise BenchError(f"default proposal gave {child.encr_alg}-{child.encr_keysize}/{child.integ_alg}")
    return found


def _cpus(text: str) -> frozenset[int]:
    try:
        return parse_cpus(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", help="negotiating table: a name in the shipped tables or a YAML file "
                                        "(default: measure one through real tunnels now)")
    parser.add_argument("--repetitions", type=int, default=5, help="interleaved rounds of the verification")
    parser.add_argument("--duration", type=int, default=1, help="seconds per iperf3 run (whole seconds)")
    parser.add_argument("--table-repetitions", type=int, default=2)
    parser.add_argument("--table-duration", type=int, default=1)
    parser.add_argument("--cpus", type=_cpus, default=None,
                        help="pin both charons (all threads), iperf3 and ping to these CPUs for both measurements, "
                             "e.g. 1 or 0,1 (default: not pinned)")
    parser.add_argument("--micro", help="the measured table's prior: `qoss bench micro --out` JSON of this machine "
                                        "(default: measure the candidate transforms now)")
    parser.add_argument("--no-prior", action="store_true",
                        help="the measured table from the tunnel samples alone (no micro-benchmark prior)")
    parser.add_argument("--save", help="also write the run's data (rounds per suite, choices) to this JSON file")
    parser.add_argument("--from", dest="source", help="measure nothing: print the report of a run saved with --save")
    args = parser.parse_args()
    if args.source:
        report(json.loads(Path(args.source).read_text()))
        return
    if not (1 <= args.repetitions <= 20 and 1 <= args.table_repetitions <= 20
            and 1 <= args.duration <= 10 and 1 <= args.table_duration <= 10):
        parser.error("repetitions 1-20, durations 1-10 s")
    given_prior = None
    if args.micro:
        if args.no_prior or args.table:
            parser.error("--micro is the prior of a table measured now: not with --no-prior or --table")
        try:
            given_prior = read_micro_prior(Path(args.micro), machine_id())
        except ValueError as exc:
            parser.error(f"--micro: {exc}")
    started = time.monotonic()
    load = os.getloadavg()
    with bench_lab(prefix_hint="qcq") as bl:
        usable = bl.candidates()
        star = default_suites(usable)
        prior = None if args.table or args.no_prior else given_prior or _prior(usable)
        table = _table(bl, args, star, prior)
        candidates = bl.candidates(table)
        suites = [s for s in star if set(s.transforms) <= set(candidates)]
        default = _strongswan_default(bl)
        print(f"table {table}; {len(suites)} suites; strongSwan default ESP proposal negotiates {default.name}",
              file=sys.stderr)

        chosen: dict[tuple[int, int, int], SuiteSpec] = {}
        feasible: dict[tuple[int, int, int], list[SuiteSpec]] = {}
        for vector in VECTORS:
            levels = Levels(confidentiality=vector[0], integrity=vector[1], key_exchange=vector[2])
            opener = bl.tunnels(candidates, rating_table=table, min_levels=levels)
            try:
                tunnel = opener.choose()  # the API's path: negotiate, load both ends, initiate, verify
            except NegotiationError as exc:
                print(f"C{vector[0]}/I{vector[1]}/K{vector[2]}: nothing feasible ({exc})", file=sys.stderr)
                continue
            opener.close(tunnel)
            chosen[vector] = parse_suite(tunnel.esp)
            feasible[vector] = [s for s in suites if _feasible(bl, table, s, levels, candidates)]
        measure = list(dict.fromkeys([*chosen.values(), default, *(s for f in feasible.values() for s in f)]))
        print(f"verifying: {len(measure)} suites x {args.repetitions} x {args.duration:g} s", file=sys.stderr)
        _, runs, skipped = run_bench(initiator=bl.initiator, responder=bl.responder,
                                     opener=bl.tunnels(bl.candidates()), suites=measure,
                                     repetitions=args.repetitions, duration=args.duration, flows=(1,), sizes=(),
                                     baseline=False, cpus=args.cpus)
    data = {
        "vectors": [{"minimums": list(v), "chosen": chosen[v].name, "feasible": [f.name for f in feasible[v]]}
                    for v in chosen],
        "default": default.name,
        "rounds": {r.spec.name: r.throughput_mbps for r in runs if r.spec is not None},
        "cpu_ns_per_byte": {r.spec.name: r.cpu_ns_per_byte for r in runs if r.spec is not None},
        "skipped": skipped,
        "repetitions": args.repetitions, "duration": args.duration, "cpus": sorted(args.cpus) if args.cpus else None,
        "table": "given" if args.table else ("measured, micro-benchmark prior" if prior else "measured, no prior"),
        "machine": machine_id(), "load": [load[0], os.getloadavg()[0]], "seconds": round(time.monotonic() - started),
    }
    if args.save:
        Path(args.save).write_text(json.dumps(data, indent=1))
    report(data)


def cross_validated(pick: str, pool: list[str], rounds: dict[str, list[float]]) -> float:
    """chosen/best with "best" picked on other rounds than it is compared on (two-fold).

    The rounds are split into even and odd ones; "best" is the feasible suite of highest
    median over one half, and the chosen suite is compared with it round by round over the
    other half (median of the same-round ratios); the result is the mean of both ways
    round. Picking and comparing on the same samples (the ratio of medians) is biased low
    by the winner's curse; this estimate is not, only noisier, and may exceed 1 when the
    suite that looked best on one half was merely lucky there.
    """
    n = min(len(rounds[s]) for s in pool)
    if n < 2:
        return rounds[pick][0] / max(rounds[s][0] for s in pool)
    halves = (range(0, n, 2), range(1, n, 2))
    estimates = []
    for chooser, judge in (halves, halves[::-1]):
        best = max(pool, key=lambda s: statistics.median(rounds[s][i] for i in chooser))
        estimates.append(statistics.median(rounds[pick][i] / rounds[best][i] for i in judge))
    return statistics.fmean(estimates)


def perfect_choice(pick: str, pool: list[str], rounds: dict[str, list[float]], *, trials: int = 2000,
                   seed: int = 1) -> tuple[float, float, int]:
    """The ratio of medians that a choice exactly as fast as the best would get, with this run's noise.

    The suites *tied* with the best are those of the pool whose median lies within two
    standard errors of the best median (log scale, ``sigma`` pooled over the rounds of every
    suite in ``rounds``). Each tied suite and the chosen one keeps its own rounds scaled to
    median 1: its own noise, no difference in speed. A trial draws each one's rounds again
    (with replacement) and takes the chosen suite's median over the largest median.

    Returns:
        The median ratio over the trials, the share of trials reaching :data:`GOAL`, and
        how many suites (the chosen one included) took part.
    """
    sigma = pooled_log_sd(vs for vs in rounds.values() if vs and min(vs) > 0) or 0.0
    medians = {s: statistics.median(rounds[s]) for s in dict.fromkeys([pick, *pool])}
    best = max(medians.values())
    se = math.sqrt(math.pi / 2) * sigma * math.sqrt(2 / len(rounds[pick]))  # of the log ratio of two medians
    members = [s for s in medians if s == pick or math.log(best / medians[s]) <= 2 * se]
    scaled = {s: [v / medians[s] for v in rounds[s]] for s in members}
    rng = random.Random(seed)
    ratios = []
    for _ in range(trials):
        drawn = {s: statistics.median(rng.choices(v, k=len(v))) for s, v in scaled.items()}
        ratios.append(drawn[pick] / max(drawn.values()))
    return statistics.median(ratios), sum(r >= GOAL for r in ratios) / trials, len(members)


def report(data: dict[str, Any]) -> None:
    """Print the per-vector table and the summary of one run's data."""
    rounds: dict[str, list[float]] = {k: v for k, v in data["rounds"].items() if v}
    stats = {s: summarize(v) for s, v in rounds.items()}
    mbps = {s: st.median for s, st in stats.items()}
    cpu = {s: statistics.median(v) for s, v in data["cpu_ns_per_byte"].items() if v}
    spread = {s: st.spread for s, st in stats.items()}
    default = data["default"]
    for name, reason in data["skipped"].items():
        print(f"skipped {name}: {reason}", file=sys.stderr)
    print(f"{'minimums':<12} {'chosen':<18} {'Mbit/s':>7} {'best feasible':<18} {'Mbit/s':>7} {'ratio':>6} "
          f"{'cv':>6} {'n':>3} {'chosen/default':>14} {'paired':>6} {'won':>5} {'CPU':>6} {'cheapest CPU':<18} "
          f"{'perfect':>7} {'tied':>4}")
    ratios, cvs, vs_default, cpu_ratios, floors = [], [], [], [], []
    for row in data["vectors"]:
        vector, pick = row["minimums"], row["chosen"]
        label = f"C{vector[0]}/I{vector[1]}/K{vector[2]}"
        pool = [s for s in dict.fromkeys([*row["feasible"], pick]) if s in mbps]
        if pick not in mbps or not pool:
            print(f"{label}: {pick} not measured")
            continue
        best = max(pool, key=lambda s: mbps[s])
        ratio = mbps[pick] / mbps[best]
        ratios.append(ratio)
        cv = cross_validated(pick, pool, rounds)
        cvs.append(cv)
        d = "-"
        if default in row["feasible"] and default in mbps:
            vs_default.append(mbps[pick] / mbps[default])
            d = f"{mbps[pick] / mbps[default]:.3f}"
        # Same-round comparison with the best of the medians: both measured once per round.
        pairs = list(zip(rounds[pick], rounds[best], strict=False))
        paired = statistics.median(c / b for c, b in pairs)
        won = sum(1 for c, b in pairs if c >= b)
        # CPU cost: both charons' CPU time per byte; cheapest/chosen (1: nothing feasible costs less).
        costed = [s for s in pool if s in cpu]
        cheapest = min(costed, key=lambda s: cpu[s]) if pick in cpu and costed else None
        cpu_ratio = cpu[cheapest] / cpu[pick] if cheapest is not None else math.nan
        if cheapest is not None:
            cpu_ratios.append(cpu_ratio)
        floor, reach, tied = perfect_choice(pick, pool, rounds)
        floors.append((floor, reach))
        print(f"{label:<12} {pick:<18} {mbps[pick]:>7.0f} {best:<18} {mbps[best]:>7.0f} {ratio:>6.3f} {cv:>6.3f} "
              f"{len(pool):>3} {d:>14} {paired:>6.3f} {f'{won}/{len(pairs)}':>5} {cpu_ratio:>6.3f} "
              f"{cheapest or '-':<18} {floor:>7.3f} {tied:>4}")
    if ratios:
        widest = max(len(r["feasible"]) for r in data["vectors"])
        print(f"worst chosen/best (ratio of medians): {min(ratios):.3f} (goal >= 0.97); "
              f"median {statistics.median(ratios):.3f}; conservative: the best of up to {widest} noisy medians "
              "is biased upwards")
        print(f"worst chosen/best cross-validated (cv: best picked on the other half of the rounds): "
              f"{min(cvs):.3f}; median {statistics.median(cvs):.3f}")
        floor, reach = min(floors)
        print(f"a perfect choice (exactly as fast as the best; 'perfect': bootstrap of this run's own rounds, the "
              f"'tied' suites within two standard errors of the best) would score a ratio of medians of {floor:.3f} "
              f"at the worst vector, >= {GOAL} in {reach:.0%} of trials")
    if cpu_ratios:
        print(f"worst cheapest/chosen by charon CPU time per byte: {min(cpu_ratios):.3f}; "
              f"median {statistics.median(cpu_ratios):.3f}")
    if vs_default:
        print(f"chosen/default where the default meets the minimums: worst {min(vs_default):.3f}, "
              f"median {statistics.median(vs_default):.3f} (goal: never below 1)")
    noisy = sorted(spread.items(), key=lambda kv: -kv[1])[:3]
    print(f"run-to-run spread (max-min)/median: median over suites {statistics.median(spread.values()):.2f}; "
          "largest " + ", ".join(f"{s} {v:.2f}" for s, v in noisy))
    print(f"load average at start {data['load'][0]:.1f}, at end {data['load'][1]:.1f} (2 cores, shared)")
    cpus = frozenset(data["cpus"]) if data.get("cpus") else None
    print(f"{data['repetitions']} interleaved rounds x {data['duration']:g} s iperf3 per suite; {pinning(cpus)}; "
          f"table {data.get('table', 'measured, no prior')}; machine {data['machine']}; {data['seconds']} s")

if __name__ == "__main__":
    main()
