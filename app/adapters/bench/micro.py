"""Micro benchmark: per-packet cost of each transform the `cryptography` library offers.

Measured the way ESP uses them and the engine costs them (seed 000 Table 3: costs add):
a cipher alone (CBC/CTR encryption of the payload), a MAC alone (HMAC / CMAC over it),
an AEAD as one seal. Keys are set up once per SA as in ESP (one cipher context, a keyed
MAC state copied per packet), so the per-packet term ``b`` is the call itself plus, for
a MAC or AEAD, its finalisation; Python's call overhead (~0.1 us) is in every ``b``.

Each algorithm is timed at 64, 300, 700 and 1400 bytes after a warm-up, in repeated runs
until the run-to-run spread is at most half of ``target_spread`` (a margin, so the figure
kept is well within it) or its time budget is used: many short (~0.3 ms) timed batches
over at least a quarter of the budget (so a burst of other load cannot fill a whole run),
the 10th percentile kept per size (see ``scoring.low_estimate``), and ``ns = a*bytes + b``
fitted. An algorithm still above ``target_spread`` at the end of the sweep is measured
again (up to twice, within ``sweep_limit`` seconds for the whole sweep); the steadier
run is kept.

Key exchange: key generation + shared secret per group (an IKE_SA_INIT's DH work on one
side): X25519/X448, every NIST and Brainpool curve the library offers, and the MODP groups
from their published primes (``app.domain.modp_groups``; OpenSSL picks a short private
exponent for the RFC 3526/5114 groups it knows, a full-length one for the RFC 2409 groups
1 and 2, so those two cost more than their size suggests). A key exchange gets twice the
per-algorithm budget (one operation takes 0.05-15 ms, so fewer batches fit), and a slow
group at least the time of 100 operations, up to 3 s.

The timings are userspace crypto on this machine (as kernel-libipsec does it), not kernel ESP.
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.decrepit.ciphers.algorithms import CAST5, Blowfish, Camellia, TripleDES
from cryptography.hazmat.primitives import cmac, hashes, hmac
from cryptography.hazmat.primitives.asymmetric import dh, ec, x448, x25519
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESCCM, AESGCM, ChaCha20Poly1305
from cryptography.utils import CryptographyDeprecationWarning

from app.domain.modp_groups import MODP_GROUPS, ModpGroup
from app.domain.scoring import SIZES, MicroResult, low_estimate, split_half_spread

__all__ = ["BACKEND", "KERNELS", "available", "library_version", "machine_id", "run_micro"]

#: What does the crypto in these measurements (the measured tables' ``backend``).
BACKEND = "userspace crypto (cryptography/OpenSSL)"

Kernel = Callable[[bytes], object]


@dataclass(frozen=True)
class _Spec:
    method: str
    make: Callable[[], Kernel]


def _cbc(alg: Callable[[bytes], object], key_bytes: int, block: int) -> Callable[[], Kernel]:
    def make() -> Kernel:
        key, iv = os.urandom(key_bytes), os.urandom(block)
        # One context per SA, as ESP keeps one: the key schedule is made once. Chaining on
        # from the previous packet costs what a fresh per-packet IV costs (one XOR per block).
        # ESP pads the payload to the block size; the padded copy is made once per size (a
        # partial block left in the context made the small-packet timings bimodal).
        enc = Cipher(alg(key), modes.CBC(iv)).encryptor()  # type: ignore[arg-type]
        padded: dict[int, bytes] = {}

        def run(data: bytes) -> object:
            full = padded.get(len(data))
            if full is None:
                full = padded[len(data)] = data + bytes((-len(data)) % block)
            return enc.update(full)

        return run

    return make


def _ctr(key_bytes: int) -> Callable[[], Kernel]:
    def make() -> Kernel:
        enc = Cipher(algorithms.AES(os.urandom(key_bytes)), modes.CTR(os.urandom(16))).encryptor()
        # One keystream per SA; each packet takes whole counter blocks, as ESP's per-packet
        # counter block (RFC 3686) does, so no partial block carries over between packets.
        padded: dict[int, bytes] = {}

        def run(data: bytes) -> object:
            full = padded.get(len(data))
            if full is None:
                full = padded[len(data)] = data + bytes((-len(data)) % 16)
            return enc.update(full)

        return run

    return make


def _hmac(algorithm: Callable[[], hashes.HashAlgorithm], tag_bytes: int | None = None) -> Callable[[], Kernel]:
    def make() -> Kernel:
        keyed = hmac.HMAC(os.urandom(32), algorithm())  # inner/outer pads hashed once per SA

        def run(data: bytes) -> object:
            h = keyed.copy()
            h.update(data)
            return h.finalize()[:tag_bytes]

        return run

    return make


def _cmac() -> Kernel:
    keyed = cmac.CMAC(algorithms.AES(os.urandom(16)))

    def run(data: bytes) -> object:
        c = keyed.copy()
        c.update(data)
        return c.finalize()

    return run


def _aead(factory: Callable[[bytes], object], key_bytes: int, nonce_bytes: int,
          tag_bytes: int = 16) -> Callable[[], Kernel]:
    def make() -> Kernel:
        aead = factory(os.urandom(key_bytes))
        nonce, aad = os.urandom(nonce_bytes), os.urandom(8)
        cut = tag_bytes - 16 if tag_bytes < 16 else None

        def run(data: bytes) -> object:
            return aead.encrypt(nonce, data, aad)[:cut]  # type: ignore[attr-defined]

        return run

    return make


def _ccm(tag_bytes: int) -> Callable[[bytes], object]:
    return lambda key: AESCCM(key, tag_bytes)


def _gmac(key_bytes: int) -> Callable[[], Kernel]:
    """GMAC (ESP integrity only, RFC 4543): GCM over an empty plaintext, the packet as AAD."""
    def make() -> Kernel:
        aead, nonce = AESGCM(os.urandom(key_bytes)), os.urandom(12)

        def run(data: bytes) -> object:
            return aead.encrypt(nonce, b"", data)

        return run

    return make


def _specs() -> dict[str, _Spec]:
    specs: dict[str, _Spec] = {}
    for bits in (128, 192, 256):
        n = bits // 8
        specs[f"aes{bits}"] = _Spec("AES-CBC encrypt", _cbc(algorithms.AES, n, 16))
        specs[f"aes{bits}ctr"] = _Spec("AES-CTR encrypt", _ctr(n))
        specs[f"camellia{bits}"] = _Spec("Camellia-CBC encrypt", _cbc(Camellia, n, 16))
        specs[f"aes{bits}gcm16"] = _Spec("AES-GCM seal, 16-byte tag", _aead(AESGCM, n, 12))
        for tag in (12, 8):
            specs[f"aes{bits}gcm{tag}"] = _Spec(f"AES-GCM seal, tag cut to {tag} bytes", _aead(AESGCM, n, 12, tag))
        for tag in (16, 12, 8):
            specs[f"aes{bits}ccm{tag}"] = _Spec(f"AES-CCM seal, {tag}-byte tag",
                                                _aead(_ccm(tag), n, 11))
        specs[f"aes{bits}gmac"] = _Spec("AES-GMAC (packet as AAD)", _gmac(n))
    specs["chacha20poly1305"] = _Spec("ChaCha20-Poly1305 seal", _aead(ChaCha20Poly1305, 32, 12))
    specs["3des"] = _Spec("3DES-CBC encrypt", _cbc(TripleDES, 24, 8))
    for bits in (128, 192, 256):
        specs[f"blowfish{bits}"] = _Spec("Blowfish-CBC encrypt", _cbc(Blowfish, bits // 8, 8))
    specs["cast128"] = _Spec("CAST5-CBC encrypt", _cbc(CAST5, 16, 8))
    specs["md5"] = _Spec("HMAC-MD5", _hmac(hashes.MD5))
    specs["md5_128"] = _Spec("HMAC-MD5, 128-bit tag", _hmac(hashes.MD5))
    specs["sha1"] = _Spec("HMAC-SHA1", _hmac(hashes.SHA1))
    specs["sha1_160"] = _Spec("HMAC-SHA1, 160-bit tag", _hmac(hashes.SHA1))
    specs["sha256"] = _Spec("HMAC-SHA2-256", _hmac(hashes.SHA256))
    specs["sha256_96"] = _Spec("HMAC-SHA2-256, tag cut to 96 bits", _hmac(hashes.SHA256, 12))
    specs["sha384"] = _Spec("HMAC-SHA2-384", _hmac(hashes.SHA384))
    specs["sha512"] = _Spec("HMAC-SHA2-512", _hmac(hashes.SHA512))
    specs["aescmac"] = _Spec("AES-CMAC", _cmac)
    return specs


#: Catalogue keyword -> the library's curve (ecp224bp: the library has no brainpoolP224r1).
_CURVES: dict[str, Callable[[], ec.EllipticCurve]] = {
    "ecp192": ec.SECP192R1, "ecp224": ec.SECP224R1, "ecp256": ec.SECP256R1, "ecp384": ec.SECP384R1,
    "ecp521": ec.SECP521R1, "ecp256bp": ec.BrainpoolP256R1, "ecp384bp": ec.BrainpoolP384R1,
    "ecp512bp": ec.BrainpoolP512R1,
}


def _ecdh(curve: ec.EllipticCurve) -> Callable[[], object]:
    peer = ec.generate_private_key(curve).public_key()
    return lambda: ec.generate_private_key(curve).exchange(ec.ECDH(), peer)


def _modp(group: ModpGroup) -> Callable[[], object]:
    # cryptography warns that finite-field DH is deprecated when the parameters are built (not
    # when keys are made); IKE still negotiates these groups, so they are measured. The filter
    # is scoped to the set-up, outside any timing.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)
        params = dh.DHParameterNumbers(group.p, group.g, group.q).parameters()
    peer = params.generate_private_key().public_key()
    return lambda: params.generate_private_key().exchange(peer)


def _curve_offered(curve: ec.EllipticCurve) -> bool:
    try:
        ec.generate_private_key(curve)
    except UnsupportedAlgorithm:  # e.g. a FIPS-only OpenSSL without P-192
        return False
    return True


def _kex_keywords() -> list[str]:
    offered = [k for k, curve in _CURVES.items() if _curve_offered(curve())]
    return ["x25519", "x448", *offered, *MODP_GROUPS]


def _kex_op(keyword: str) -> Callable[[], object]:
    """Key generation + shared secret for ``keyword`` (peers' public keys made once, untimed)."""
    if keyword == "x25519":
        x25519_peer = x25519.X25519PrivateKey.generate().public_key()
        return lambda: x25519.X25519PrivateKey.generate().exchange(x25519_peer)
    if keyword == "x448":
        x448_peer = x448.X448PrivateKey.generate().public_key()
        return lambda: x448.X448PrivateKey.generate().exchange(x448_peer)
    if keyword in _CURVES:
        return _ecdh(_CURVES[keyword]())
    return _modp(MODP_GROUPS[keyword])


KERNELS: dict[str, _Spec] = _specs()


def available() -> list[str]:
    """Catalogue keywords this benchmark measures (data plane, then key exchange)."""
    return [*KERNELS, *_kex_keywords()]


def _time_per_call(kernel: Kernel, data: bytes, batch: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(batch):
        kernel(data)
    return (time.perf_counter_ns() - start) / batch


def _measure_data_plane(keyword: str, budget: float, target_spread: float, min_runs: int) -> MicroResult:
    spec = KERNELS[keyword]
    kernel = spec.make()
    payloads = {size: os.urandom(size) for size in SIZES}
    # Warm up, and size batches so that one timed batch takes about 0.3 ms.
    batch = {}
    for size, data in payloads.items():
        per = max(_time_per_call(kernel, data, 50), 1.0)
        batch[size] = max(10, int(300_000 / per))  # ~0.3 ms per timed batch
    runs: dict[int, list[float]] = {size: [] for size in SIZES}
    start = time.monotonic()
    deadline, earliest = start + budget, start + budget / 4
    while True:
        for size, data in payloads.items():
            runs[size].append(_time_per_call(kernel, data, batch[size]))
        n = len(runs[SIZES[0]])
        if n < min_runs or time.monotonic() < earliest:
            continue
        spread = max(split_half_spread(r) for r in runs.values())
        if spread <= target_spread / 2 or time.monotonic() >= deadline or n >= 2000:
            break
    return MicroResult(
        keyword=keyword,
        ns_by_size={size: low_estimate(r) for size, r in runs.items()},
        spread=spread,
        samples=n * sum(batch.values()),
        method=spec.method,
    )


def _measure_kex(keyword: str, op: Callable[[], object], budget: float, target_spread: float,
                 min_runs: int) -> MicroResult:
    op()  # warm-up
    start = time.perf_counter_ns()
    op()
    per = max(time.perf_counter_ns() - start, 1)
    batch = max(1, int(300_000 / per))
    # A slow group (MODP-6144/8192: 6-15 ms an op, more under load) gets time for 100 ops,
    # up to 3 s, so that its low percentile rests on enough runs.
    budget = max(budget, min(3.0, 100 * per / 1e9))
    times: list[float] = []
    began = time.monotonic()
    deadline, earliest = began + budget, began + budget / 4
    while True:
        start = time.perf_counter_ns()
        for _ in range(batch):
            op()
        times.append((time.perf_counter_ns() - start) / batch)
        if len(times) < min_runs or time.monotonic() < earliest:
            continue
        spread = split_half_spread(times)
        if spread <= target_spread / 2 or time.monotonic() >= deadline or len(times) >= 2000:
            break
    ops = 1e9 / low_estimate(times)
    return MicroResult(keyword=keyword, ns_by_size={}, spread=spread, samples=len(times) * batch,
                       method="key generation + shared secret", ops_per_s=ops)


def run_micro(
    keywords: Iterable[str] | None = None,
    *,
    budget_per_algorithm: float = 0.6,
    target_spread: float = 0.05,
    min_runs: int = 40,
    sweep_limit: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[MicroResult]:
    """Measure ``keywords`` (default: everything :func:`available` lists).

    Args:
        keywords: catalogue keywords to measure, in this order.
        budget_per_algorithm: seconds per data-plane transform (twice that per key exchange).
        target_spread: the run-to-run spread to reach (see ``scoring.split_half_spread``).
        min_runs: timed batches at least, per size.
        sweep_limit: seconds for the whole sweep including re-measurements (default: no
            re-measurement); the first pass always completes.
        progress: called with each keyword when its first measurement is done.

    Raises:
        ValueError: a keyword this benchmark cannot measure.
    """
    wanted = list(keywords) if keywords is not None else available()
    kex = set(_kex_keywords())
    unknown = [k for k in wanted if k not in KERNELS and k not in kex]
    if unknown:
        raise ValueError(f"cannot measure {unknown}; measurable: {available()}")

    def measure(keyword: str) -> MicroResult:
        if keyword in KERNELS:
            return _measure_data_plane(keyword, budget_per_algorithm, target_spread, min_runs)
        return _measure_kex(keyword, _kex_op(keyword), 2 * budget_per_algorithm, target_spread, min_runs)

    started = time.monotonic()
    results = []
    for keyword in wanted:
        results.append(measure(keyword))
        if progress is not None:
            progress(keyword)
    if sweep_limit is None:
        return results
    for _ in range(2):
        for i, result in enumerate(results):
            cost = (2 if result.ops_per_s is not None else 1) * budget_per_algorithm
            if result.spread <= target_spread or time.monotonic() - started + cost > sweep_limit:
                continue
            again = measure(result.keyword)
            if again.spread < result.spread:
                results[i] = again
    return results


def library_version() -> str:
    """The crypto library and the OpenSSL it runs on, e.g. ``cryptography 50.0.2, OpenSSL 3.0.19 ...``."""
    import cryptography
    from cryptography.hazmat.backends.openssl.backend import backend

    return f"cryptography {cryptography.__version__}, {backend.openssl_version_text()}"


def machine_id() -> str:
    """A short description of this machine: CPU model and core count."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores ({hashlib.sha256(model.encode()).hexdigest()[:6]})"
