"""Micro benchmark: per-packet cost of each transform the `cryptography` library offers.

Measured the way ESP uses them and the engine costs them (seed 000 Table 3: costs add):
(CBC and CTR need a new cipher context per packet for its IV; that Python-level set-up
lands in the per-packet term ``b``, so ``a`` is the cleaner cipher figure.)
a cipher alone (CBC/CTR encryption of the payload), a MAC alone (HMAC / CMAC over it),
an AEAD as one seal. Each algorithm is timed at 64, 300, 700 and 1400 bytes after a
warm-up, in repeated runs until the run-to-run spread is at most ``target_spread`` or
its time budget is used: many short (~0.3 ms) timed batches, the 10th percentile kept
per size (see ``scoring.low_estimate``), and ``ns = a*bytes + b`` fitted.
Key exchange: key generation + shared secret per group. The timings are userspace
crypto on this machine (as kernel-libipsec does it), not kernel ESP.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cryptography.hazmat.decrepit.ciphers.algorithms import CAST5, Blowfish, Camellia, TripleDES
from cryptography.hazmat.primitives import cmac, hashes, hmac
from cryptography.hazmat.primitives.asymmetric import ec, x448, x25519
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESCCM, AESGCM, ChaCha20Poly1305

from app.domain.scoring import SIZES, MicroResult, low_estimate, split_half_spread

__all__ = ["KERNELS", "available", "machine_id", "run_micro"]

Kernel = Callable[[bytes], object]


@dataclass(frozen=True)
class _Spec:
    method: str
    make: Callable[[], Kernel]


def _cbc(alg: Callable[[bytes], object], key_bytes: int, block: int) -> Callable[[], Kernel]:
    def make() -> Kernel:
        key, iv = os.urandom(key_bytes), os.urandom(block)

        def run(data: bytes) -> object:
            pad = (-len(data)) % block
            enc = Cipher(alg(key), modes.CBC(iv)).encryptor()  # type: ignore[arg-type]
            return enc.update(data + b"\0" * pad) + enc.finalize()

        return run

    return make


def _ctr(key_bytes: int) -> Callable[[], Kernel]:
    def make() -> Kernel:
        key, nonce = os.urandom(key_bytes), os.urandom(16)

        def run(data: bytes) -> object:
            enc = Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor()
            return enc.update(data) + enc.finalize()

        return run

    return make


def _hmac(algorithm: Callable[[], hashes.HashAlgorithm]) -> Callable[[], Kernel]:
    def make() -> Kernel:
        key = os.urandom(32)

        def run(data: bytes) -> object:
            h = hmac.HMAC(key, algorithm())
            h.update(data)
            return h.finalize()

        return run

    return make


def _cmac() -> Kernel:
    key = os.urandom(16)

    def run(data: bytes) -> object:
        c = cmac.CMAC(algorithms.AES(key))
        c.update(data)
        return c.finalize()

    return run


def _aead(factory: Callable[[bytes], object], key_bytes: int, nonce_bytes: int) -> Callable[[], Kernel]:
    def make() -> Kernel:
        aead = factory(os.urandom(key_bytes))
        nonce, aad = os.urandom(nonce_bytes), os.urandom(8)

        def run(data: bytes) -> object:
            return aead.encrypt(nonce, data, aad)  # type: ignore[attr-defined]

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
        specs[f"aes{bits}ccm16"] = _Spec("AES-CCM seal, 16-byte tag", _aead(lambda k: AESCCM(k, 16), n, 11))
        specs[f"aes{bits}ccm8"] = _Spec("AES-CCM seal, 8-byte tag", _aead(lambda k: AESCCM(k, 8), n, 11))
    specs["chacha20poly1305"] = _Spec("ChaCha20-Poly1305 seal", _aead(ChaCha20Poly1305, 32, 12))
    specs["3des"] = _Spec("3DES-CBC encrypt", _cbc(TripleDES, 24, 8))
    specs["blowfish128"] = _Spec("Blowfish-CBC encrypt", _cbc(Blowfish, 16, 8))
    specs["cast128"] = _Spec("CAST5-CBC encrypt", _cbc(CAST5, 16, 8))
    specs["md5"] = _Spec("HMAC-MD5", _hmac(hashes.MD5))
    specs["sha1"] = _Spec("HMAC-SHA1", _hmac(hashes.SHA1))
    specs["sha256"] = _Spec("HMAC-SHA2-256", _hmac(hashes.SHA256))
    specs["sha384"] = _Spec("HMAC-SHA2-384", _hmac(hashes.SHA384))
    specs["sha512"] = _Spec("HMAC-SHA2-512", _hmac(hashes.SHA512))
    specs["aescmac"] = _Spec("AES-CMAC", _cmac)
    return specs


def _kex_specs() -> dict[str, Callable[[], object]]:
    def ecdh(curve: ec.EllipticCurve) -> Callable[[], object]:
        peer = ec.generate_private_key(curve).public_key()
        return lambda: ec.generate_private_key(curve).exchange(ec.ECDH(), peer)

    x25519_peer = x25519.X25519PrivateKey.generate().public_key()
    x448_peer = x448.X448PrivateKey.generate().public_key()
    return {
        "x25519": lambda: x25519.X25519PrivateKey.generate().exchange(x25519_peer),
        "x448": lambda: x448.X448PrivateKey.generate().exchange(x448_peer),
        "ecp256": ecdh(ec.SECP256R1()),
        "ecp384": ecdh(ec.SECP384R1()),
        "ecp521": ecdh(ec.SECP521R1()),
        "ecp256bp": ecdh(ec.BrainpoolP256R1()),
        "ecp384bp": ecdh(ec.BrainpoolP384R1()),
        "ecp512bp": ecdh(ec.BrainpoolP512R1()),
    }


KERNELS: dict[str, _Spec] = _specs()


def available() -> list[str]:
    """Catalogue keywords this benchmark measures (data plane, then key exchange)."""
    return [*KERNELS, *_kex_specs()]


def _time_per_call(kernel: Kernel, data: bytes, batch: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(batch):
        kernel(data)
    return (time.perf_counter_ns() - start) / batch


def _measure_data_plane(keyword: str, budget: float, target_spread: float, min_runs: int) -> MicroResult:
    spec = KERNELS[keyword]
    kernel = spec.make()
    payloads = {size: os.urandom(size) for size in SIZES}
    # Warm up, and size batches so that one timed batch takes about 2 ms.
    batch = {}
    for size, data in payloads.items():
        per = max(_time_per_call(kernel, data, 50), 1.0)
        batch[size] = max(10, int(300_000 / per))  # ~0.3 ms per timed batch
    runs: dict[int, list[float]] = {size: [] for size in SIZES}
    deadline = time.monotonic() + budget
    while True:
        for size, data in payloads.items():
            runs[size].append(_time_per_call(kernel, data, batch[size]))
        n = len(runs[SIZES[0]])
        if n < min_runs:
            continue
        spread = max(split_half_spread(r) for r in runs.values())
        if spread <= target_spread or time.monotonic() >= deadline or n >= 2000:
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
    times: list[float] = []
    deadline = time.monotonic() + budget
    while True:
        start = time.perf_counter_ns()
        for _ in range(batch):
            op()
        times.append((time.perf_counter_ns() - start) / batch)
        if len(times) < min_runs:
            continue
        spread = split_half_spread(times)
        if spread <= target_spread or time.monotonic() >= deadline or len(times) >= 2000:
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
    progress: Callable[[str], None] | None = None,
) -> list[MicroResult]:
    """Measure ``keywords`` (default: everything :func:`available` lists).

    Raises:
        ValueError: a keyword this benchmark cannot measure.
    """
    wanted = list(keywords) if keywords is not None else available()
    kex = _kex_specs()
    unknown = [k for k in wanted if k not in KERNELS and k not in kex]
    if unknown:
        raise ValueError(f"cannot measure {unknown}; measurable: {available()}")
    results = []
    for keyword in wanted:
        if keyword in KERNELS:
            results.append(_measure_data_plane(keyword, budget_per_algorithm, target_spread, min_runs))
        else:
            results.append(_measure_kex(keyword, kex[keyword], budget_per_algorithm, target_spread, min_runs))
        if progress is not None:
            progress(keyword)
    return results


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
