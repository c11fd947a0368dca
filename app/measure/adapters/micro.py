"""Micro benchmark: per-packet cost of each transform the `cryptography` library offers.

Measured the way ESP uses them and the engine costs them (Niedermayer et al. Table 3: costs add):
a cipher alone (CBC/CTR encryption of the payload), a MAC alone (HMAC / CMAC over it),
an AEAD as one seal. Keys are set up once per SA as in ESP (one cipher context, a keyed
MAC state copied per packet), so the per-packet term ``b`` is the call itself plus, for
a MAC or AEAD, its finalisation; Python's call overhead (~0.1 us) is in every ``b``.

Each algorithm is timed at 64, 300, 700 and 1400 bytes after a warm-up, in short (~0.3 ms)
timed batches (a key exchange in ~3 ms batches of thread CPU time: ``_Task.time_round``).
All algorithms are timed in interleaved rounds (see :func:`run_micro`), so a burst of load
from other processes falls on all of them alike. Per size the 10th percentile of the runs
is kept (see ``scoring.low_estimate``) and ``ns = a*bytes + b`` fitted; an algorithm is
done when its run-to-run spread is at most half of ``target_spread`` (a margin, so the
figure kept is well within it) or the sweep's time is up.

Post-quantum: ML-KEM-768 and -1024 (FIPS 203, the parameter sets the library offers) as one
key generation + encapsulation + decapsulation, both ends' work of an additional key exchange,
timed as a key exchange.

Key exchange: key generation + shared secret per group (an IKE_SA_INIT's DH work on one
side): X25519/X448, every NIST and Brainpool curve the library offers, and the MODP groups
from their published primes (``app.measure.domain.modp_groups``; OpenSSL picks a short private
exponent for the RFC 3526/5114 groups it knows, a full-length one for the RFC 2409 groups
1 and 2, so those two cost more than their size suggests). A key exchange counts twice in
the sweep's time limit: one operation takes 0.05-15 ms, so fewer batches fit.

The timings are userspace crypto on this machine (as kernel-libipsec does it), not kernel ESP.
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.decrepit.ciphers.algorithms import CAST5, Blowfish, Camellia, TripleDES
from cryptography.hazmat.primitives import cmac, hashes, hmac
from cryptography.hazmat.primitives.asymmetric import dh, ec, mlkem, x448, x25519
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESCCM, AESGCM, ChaCha20Poly1305
from cryptography.utils import CryptographyDeprecationWarning

from app.domain.scoring import SIZES, MicroResult, low_estimate, split_half_spread
from app.measure.domain.modp_groups import MODP_GROUPS, ModpGroup

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


#: ML-KEM parameter sets the library offers, by catalogue keyword.
_MLKEM: dict[str, Callable[[], Any]] = {"mlkem768": mlkem.MLKEM768PrivateKey.generate,
                                        "mlkem1024": mlkem.MLKEM1024PrivateKey.generate}


def _mlkem(generate: Callable[[], Any]) -> Callable[[], object]:
    def op() -> object:
        key = generate()
        _, ciphertext = key.public_key().encapsulate()
        return key.decapsulate(ciphertext)
    return op


def _kex_keywords() -> list[str]:
    offered = [k for k, curve in _CURVES.items() if _curve_offered(curve())]
    return ["x25519", "x448", *offered, *MODP_GROUPS, *_MLKEM]


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
    if keyword in _MLKEM:
        return _mlkem(_MLKEM[keyword])
    return _modp(MODP_GROUPS[keyword])


KERNELS: dict[str, _Spec] = _specs()


def available() -> list[str]:
    """Catalogue keywords this benchmark measures (data plane, then key exchange)."""
    return [*KERNELS, *_kex_keywords()]


def _time_per_call(kernel: Callable[[bytes], object], data: bytes, batch: int,
                   clock: Callable[[], int] = time.perf_counter_ns) -> float:
    start = clock()
    for _ in range(batch):
        kernel(data)
    return (clock() - start) / batch


@dataclass
class _Task:
    """One algorithm being measured: its kernel, batch sizes and the timed batches so far.

    A key exchange is a kernel that ignores its argument, timed at the pseudo-size 0.
    """

    keyword: str
    method: str
    kernel: Callable[[bytes], object]
    payloads: dict[int, bytes]
    batch: dict[int, int]
    kex: bool
    runs: dict[int, list[float]] = field(default_factory=dict)
    spread: float = 1.0

    def time_round(self) -> None:
        # A key exchange is timed in this thread's CPU time: an operation of several ms
        # outlasts a scheduler time slice on a busy machine, and wall time would count the
        # wait for the CPU (MODP-8192 read 2x slower at load 10). The clock costs a system
        # call (~1-6 us), so key-exchange batches are sized to ~3 ms.
        clock = time.thread_time_ns if self.kex else time.perf_counter_ns
        for size, data in self.payloads.items():
            self.runs.setdefault(size, []).append(_time_per_call(self.kernel, data, self.batch[size], clock))

    @property
    def rounds(self) -> int:
        return min((len(r) for r in self.runs.values()), default=0)

    def judge(self) -> float:
        self.spread = max(split_half_spread(r) for r in self.runs.values())
        return self.spread

    def result(self) -> MicroResult:
        samples = self.rounds * sum(self.batch.values())
        if self.kex:
            return MicroResult(keyword=self.keyword, ns_by_size={}, spread=self.spread, samples=samples,
                               method=self.method, ops_per_s=1e9 / low_estimate(self.runs[0]))
        return MicroResult(keyword=self.keyword, ns_by_size={s: low_estimate(r) for s, r in self.runs.items()},
                           spread=self.spread, samples=samples, method=self.method)


def _prepare(keyword: str) -> _Task:
    """Build the kernel, warm it up, and size its batches (~0.3 ms; a key exchange ~3 ms)."""
    if keyword in KERNELS:
        spec = KERNELS[keyword]
        kernel: Callable[[bytes], object] = spec.make()
        payloads = {size: os.urandom(size) for size in SIZES}
        method, kex = spec.method, False
    else:
        op = _kex_op(keyword)
        kernel, payloads = (lambda _data: op()), {0: b""}
        method = ("key generation + encapsulation + decapsulation" if keyword in _MLKEM
                  else "key generation + shared secret")
        kex = True
    batch = {}
    for size, data in payloads.items():
        kernel(data)  # warm-up
        per = max(_time_per_call(kernel, data, 1 if kex else 50), 1.0)
        batch[size] = max(1, int(3_000_000 / per)) if kex else max(10, int(300_000 / per))
    return _Task(keyword, method, kernel, payloads, batch, kex)


def run_micro(
    keywords: Iterable[str] | None = None,
    *,
    budget_per_algorithm: float = 0.6,
    target_spread: float = 0.05,
    min_runs: int = 40,
    sweep_limit: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[MicroResult]:
    """Measure ``keywords`` (default: everything :func:`available` lists), interleaved.

    Every algorithm is timed in rounds: one short batch per packet size (one batch per key
    exchange) for each algorithm still being measured, then the next round. Load from other
    processes therefore falls on all algorithms alike instead of on whichever was being
    timed when it came, and the low percentile of an algorithm's runs is drawn from the
    whole sweep. An algorithm is done after ``min_runs`` rounds once its spread is at most
    half of ``target_spread``, or when the sweep's time is up (but never before ``min_runs``
    rounds: on a very busy machine the sweep takes longer rather than judging on too few).

    Args:
        keywords: catalogue keywords to measure; the results keep this order.
        budget_per_algorithm: seconds per data-plane transform, twice that per key exchange;
            their sum is the sweep's time limit.
        target_spread: the run-to-run spread to reach (see ``scoring.split_half_spread``).
        min_runs: rounds at least.
        sweep_limit: seconds for the whole sweep at most, if less than the sum of budgets.
        progress: called with each keyword when it is done (in the order they finish).

    Raises:
        ValueError: a keyword this benchmark cannot measure.
    """
    wanted = list(keywords) if keywords is not None else available()
    kex = set(_kex_keywords())
    unknown = [k for k in wanted if k not in KERNELS and k not in kex]
    if unknown:
        raise ValueError(f"cannot measure {unknown}; measurable: {available()}")
    tasks = {k: _prepare(k) for k in wanted}
    limit = budget_per_algorithm * sum(2 if t.kex else 1 for t in tasks.values())
    if sweep_limit is not None:
        limit = min(limit, sweep_limit)
    deadline = time.monotonic() + limit
    active = list(tasks.values())

    def finish(task: _Task) -> None:
        active.remove(task)
        if progress is not None:
            progress(task.keyword)

    while active:
        late = time.monotonic() >= deadline  # past it, an algorithm stops at min_runs rounds
        for task in list(active):
            task.time_round()
            if task.rounds < min_runs:
                continue
            if late or task.rounds >= 2000:
                task.judge()
                finish(task)
            elif task.rounds % 5 == 0 and task.judge() <= target_spread / 2:
                finish(task)
    return [tasks[k].result() for k in wanted]


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
