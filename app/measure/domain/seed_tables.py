"""The seed papers' performance tables, transcribed (pure data), for `qoss bench report`.

Each row names the catalogue keywords its transform set is made of (an ESP cipher, a MAC,
or an AEAD; costs add, Niedermayer et al. Table 3), the paper's figure, and where it is printed.

- Niedermayer et al.: Niedermayer, Klenk, Carle, "The Networking Perspective of Security Performance -
  a Measurement Study" (2006): Table 8 (ESP, transport mode, iperf Mbit/s, kernels 2.6.9 and
  2.6.13), Table 10 (ESP+AH, transport mode, kernel 2.6.9), Table 14 (ESAF performance levels).
- Thiruvasagam and George: Thiruvasagam, George, "IPSec: Performance Analysis in IPv4 and IPv6" (2019):
  Table 5 (strongSwan ESP tunnel mode, iperf3 Mbit/s, TCP and UDP over IPv4 and IPv6).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["SEED_TABLES", "SeedRow", "SeedTable"]


@dataclass(frozen=True, slots=True)
class SeedRow:
    """One row of a paper's table.

    Attributes:
        label: the row as the paper prints it.
        keywords: the catalogue keywords whose costs make up the row (empty: no IPsec).
        value: the figure the paper ranks by (the table's ``unit``).
        citation: paper, table, row and column the value is read from.
        extra: the row's other columns (e.g. the newer kernel, or a security level).
    """

    label: str
    keywords: tuple[str, ...]
    value: float
    citation: str
    extra: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SeedTable:
    """A paper's table: higher ``value`` is faster in every one of them."""

    key: str
    title: str
    unit: str
    rows: tuple[SeedRow, ...]


def _t8(label: str, keyword: str, k269: float, k2613: float) -> SeedRow:
    return SeedRow(label, (keyword,), k269, f"Niedermayer et al. Table 8, row 'ESP with {label}', kernel 2.6.9",
                   {"kernel 2.6.13": k2613})


_TABLE_8 = SeedTable("000-T8", "Niedermayer et al. Table 8: ESP, transport mode, kernel 2.6.9", "Mbit/s", (
    _t8("AES-128", "aes128", 314, 456),
    _t8("AES-192", "aes192", 295, 419),
    _t8("Blowfish-128", "blowfish128", 192, 336),
    _t8("Blowfish-192", "blowfish192", 192, 337),
    _t8("DES", "des", 132, 212),
    _t8("3DES", "3des", 66, 97),
))

_T10_CIPHERS = (("AES-128", "aes128"), ("AES-192", "aes192"), ("Blowfish-128", "blowfish128"),
                ("Blowfish-192", "blowfish192"), ("3DES", "3des"))
_T10_MACS = (("MD5", "md5"), ("SHA-1", "sha1"), ("SHA-2-256", "sha256"))
_T10_VALUES = ((231, 166, 123), (225, 160, 120), (164, 127, 99), (163, 127, 99), (60, 56, 50))

_TABLE_10 = SeedTable("000-T10", "Niedermayer et al. Table 10: ESP+AH, transport mode, kernel 2.6.9", "Mbit/s", tuple(
    SeedRow(f"{cipher} + {mac}", (ck, mk), _T10_VALUES[i][j],
            f"Niedermayer et al. Table 10, row '{cipher}', column '{mac}'")
    for i, (cipher, ck) in enumerate(_T10_CIPHERS) for j, (mac, mk) in enumerate(_T10_MACS)
))


def _t14(label: str, keyword: str, security: float, performance: float, column: str) -> SeedRow:
    return SeedRow(label, (keyword,), performance,
                   f"Niedermayer et al. Table 14, row '{label}', column 'Performance'", {column: security})


_TABLE_14_ENC = SeedTable("000-T14-enc", "Niedermayer et al. Table 14: ESAF performance levels, encryption",
                          "level 0-10", (
    _t14("AES-128", "aes128", 8, 8, "confidentiality"),
    _t14("AES-192", "aes192", 9, 7, "confidentiality"),
    _t14("DES", "des", 2, 4, "confidentiality"),
    _t14("3DES", "3des", 8, 2, "confidentiality"),
    _t14("Blowfish-128", "blowfish128", 9, 6, "confidentiality"),
    _t14("Blowfish-192", "blowfish192", 10, 6, "confidentiality"),
))

_TABLE_14_AUTH = SeedTable("000-T14-auth", "Niedermayer et al. Table 14: ESAF performance levels, authentication",
                           "level 0-10", (
    _t14("HMAC-MD5", "md5", 2, 9, "integrity"),
    _t14("HMAC-SHA-1", "sha1", 5, 6, "integrity"),
    _t14("HMAC-SHA-2-256", "sha256", 8, 3, "integrity"),
))


def _t5(label: str, keywords: tuple[str, ...], tcp4: float, udp4: float, tcp6: float, udp6: float) -> SeedRow:
    return SeedRow(label, keywords, tcp4,
                   f"Thiruvasagam and George Table 5, row '{label}', column 'IPv4 Throughput (TCP)'",
                   {"IPv4 UDP": udp4, "IPv6 TCP": tcp6, "IPv6 UDP": udp6})


_TABLE_5 = SeedTable("004-T5", "Thiruvasagam and George Table 5: strongSwan ESP tunnel mode, IPv4 TCP", "Mbit/s", (
    _t5("No IPSec", (), 935, 951, 921, 933),
    _t5("AES128-GCM16", ("aes128gcm16",), 899, 942, 873, 885),
    _t5("AES128-CCM16", ("aes128ccm16",), 773, 817, 737, 807),
    # The text layer prints "AES128-SHA1 160 839 931 804 826" and "AES128-SHA2 256 710 ...":
    # each MAC is named with its hash size (SHA1 160, SHA2 256), the four figures follow.
    # Read as HMAC-SHA1 and HMAC-SHA2-256, strongSwan's sha1 and sha256.
    _t5("AES128-SHA1 160", ("aes128", "sha1"), 839, 931, 804, 826),
    _t5("AES128-SHA2 256", ("aes128", "sha256"), 710, 835, 637, 643),
    _t5("AES128CBC-NULL", ("aes128",), 903, 945, 878, 888),
))

#: Every transcribed table, in the order the report shows them.
SEED_TABLES: tuple[SeedTable, ...] = (_TABLE_8, _TABLE_10, _TABLE_14_ENC, _TABLE_14_AUTH, _TABLE_5)
