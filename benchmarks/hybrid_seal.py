"""What the hybrid seal costs per message beside X25519 alone, in-process.

    .venv/bin/python -m benchmarks.hybrid_seal [--messages 2000] [--warmup 200] [--budget 60]

Three of the tunnel agent's messages as a connect exchanges them: the client's request to Host,
Host's endorsement to Target (the user's keys inside, its ML-KEM-768 key among them) and Target's
answer to the client (the session key inside). Each is sealed (Ed25519 signature, then HPKE) and
opened (HPKE, then the signature checked) by the adapter's own functions, once with X25519 alone
(HPKE DHKEM-X25519, wire version 1) and once hybrid (X-Wing: ML-KEM-768 + X25519, version 2),
taking turns in every round (the order flips each round) so both see the same machine. Printed:
per message and mode the wire size and the median (p50) and p99 of sealing and of opening, then
what the hybrid seal adds per message. Every loop is bounded in count (``--messages``) and in
time (``--budget`` seconds for the whole run); ``--warmup`` rounds are run first, untimed.
"""

from __future__ import annotations

import argparse
import functools
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.adapters.agent.crypto import CRYPTO, KeyPair, PublicKeys  # noqa: E402
from app.domain.agent import (  # noqa: E402
    ClientRequest,
    EnrolledUser,
    Kind,
    RequestInfo,
    Response,
    TunnelingInfo,
)
from app.domain.agent.messages import Endorsement  # noqa: E402

MODES = ("x25519", "hybrid")


def messages(client: KeyPair, host: KeyPair, target: KeyPair) -> list[tuple[str, Kind, bytes, KeyPair, KeyPair]]:
    """(name, kind, body, sender, recipient) of a connect's three messages, with realistic bodies."""
    now = int(time.time())
    info = RequestInfo(target=target.name, min_levels={"confidentiality": 5, "integrity": 5},
                       supports=("aes128gcm16", "aes256gcm16", "chacha20poly1305", "sha256", "prfsha256", "x25519",
                                 "ecp256", "modp2048"))
    request = ClientRequest(kind=Kind.CONNECT, request_id=secrets.token_bytes(16), user_id=client.name,
                            objective_id=3, request_info=info, host=host.name, timestamp=now)
    public = client.public
    user = EnrolledUser(user_id=client.name, sign_public_key=public.sign, kem_public_key=public.kem,
                        objectives=frozenset({3}), mlkem_public_key=public.mlkem)
    body = request.body()
    endorsement = Endorsement(kind=Kind.ENDORSE, host=host.name, target=target.name, nonce=secrets.token_bytes(16),
                              timestamp=now, user=user, client_kind=Kind.CONNECT, client_body=body,
                              client_tag=client.sign(Kind.CONNECT, body))
    tunneling = TunnelingInfo(ticket=secrets.token_hex(16), protection="esp", target_address="10.99.0.3",
                              target_identity="gw.qoss", client_identity=f"{client.name}.qoss",
                              remote_ts=("10.3.0.0/24",), ike_proposal="aes128gcm16-prfsha256-x25519",
                              esp_proposal="aes128gcm16-x25519", mode="tunnel",
                              suite={"esp": "aes128gcm16-x25519"}, notes=(), expires=now + 600)
    response = Response(kind=Kind.RESPONSE, request_id=request.request_id, session_key=secrets.token_bytes(32),
                        tunneling_info=tunneling, target=target.name, user_id=client.name, host=host.name,
                        timestamp=now)
    return [("request (client -> Host)", Kind.CONNECT, body, client, host),
            ("endorse (Host -> Target)", Kind.ENDORSE, endorsement.body(), host, target),
            ("answer (Target -> client)", Kind.RESPONSE, response.body(), target, client)]


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) / 1e3


def measure(n: int, warmup: int, budget: float) -> list[dict[str, object]]:
    """Per message and mode: wire bytes, seal and open p50/p99 in microseconds, and how many rounds ran."""
    client, host, target = KeyPair.generate("alice"), KeyPair.generate("hq"), KeyPair.generate("far")
    deadline = time.monotonic() + budget
    rows: list[dict[str, object]] = []
    for name, kind, body, sender, recipient in messages(client, host, target):
        public = recipient.public

        def seal(mode: str, kind: Kind = kind, body: bytes = body, sender: KeyPair = sender,
                 to: str = recipient.name, public: PublicKeys = public) -> bytes:
            return sender.seal(kind=kind, to=to, body=body, recipient=public.kem,
                               recipient_mlkem=public.mlkem if mode == "hybrid" else None)

        def open_(wire: bytes, kind: Kind = kind, recipient: KeyPair = recipient, sender: KeyPair = sender) -> None:
            got, opened, tag = recipient.open_sealed(wire, kinds=[kind])
            CRYPTO.verify(sender.public.sign, got, opened, tag)

        wires = {mode: seal(mode) for mode in MODES}
        for _ in range(warmup):
            for mode in MODES:
                open_(seal(mode))
        samples: dict[str, dict[str, list[float]]] = {m: {"seal": [], "open": []} for m in MODES}
        for i in range(n):
            if time.monotonic() > deadline:
                break
            for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                samples[mode]["seal"].append(_timed(functools.partial(seal, mode)))
                samples[mode]["open"].append(_timed(functools.partial(open_, wires[mode])))
        for mode in MODES:
            seal_s, open_s = sorted(samples[mode]["seal"]), sorted(samples[mode]["open"])
            rows.append({"message": name, "mode": mode, "wire_bytes": len(wires[mode]), "rounds": len(seal_s),
                         "seal_p50_us": statistics.median(seal_s) if seal_s else float("nan"),
                         "seal_p99_us": seal_s[max(0, int(len(seal_s) * 0.99) - 1)] if seal_s else float("nan"),
                         "open_p50_us": statistics.median(open_s) if open_s else float("nan"),
                         "open_p99_us": open_s[max(0, int(len(open_s) * 0.99) - 1)] if open_s else float("nan")})
    return rows


def report(rows: list[dict[str, object]]) -> str:
    lines = ["| message | mode | wire bytes | seal p50 (p99) µs | open p50 (p99) µs | rounds |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['message']} | {r['mode']} | {r['wire_bytes']:,} | {r['seal_p50_us']:.0f} "
                     f"({r['seal_p99_us']:.0f}) | {r['open_p50_us']:.0f} ({r['open_p99_us']:.0f}) | {r['rounds']} |")
    by = {(str(r["message"]), str(r["mode"])): r for r in rows}

    def more(message: str, key: str) -> float:
        return float(str(by[(message, "hybrid")][key])) - float(str(by[(message, "x25519")][key]))

    for message in dict.fromkeys(str(r["message"]) for r in rows):
        lines.append(f"hybrid - x25519, {message}: seal +{more(message, 'seal_p50_us'):.0f} µs, "
                     f"open +{more(message, 'open_p50_us'):.0f} µs, "
                     f"+{more(message, 'wire_bytes'):,.0f} bytes on the wire")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=2000, help="rounds per message (each: both modes)")
    parser.add_argument("--warmup", type=int, default=200, help="untimed rounds first")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds for the whole run at most")
    args = parser.parse_args(argv)
    print(report(measure(args.messages, args.warmup, args.budget)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
