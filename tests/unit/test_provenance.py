"""app.web.provenance: whose address a forwarded header may name, and whose request id we keep."""

from __future__ import annotations

import pytest

from app.web.provenance import TrustedProxies, client_request_id, new_request_id

XFF = b"x-forwarded-for"
FWD = b"forwarded"


@pytest.mark.parametrize(("peer", "headers", "expected"), [
    ("192.0.2.50", [(XFF, b"6.6.6.6")], "192.0.2.50"),  # not a proxy of ours: its headers are ignored
    ("10.0.0.5", [(XFF, b"6.6.6.6")], "6.6.6.6"),
    ("10.0.0.5", [(XFF, b"1.1.1.1, 203.0.113.9, 10.0.0.7")], "203.0.113.9"),  # read from the right
    ("10.0.0.5", [(XFF, b"1.1.1.1"), (XFF, b"203.0.113.9")], "203.0.113.9"),  # repeated header lines
    ("10.0.0.5", [(XFF, b"10.0.0.8, 10.0.0.7")], "10.0.0.8"),  # proxies all the way: the farthest
    ("10.0.0.5", [(XFF, b"203.0.113.9, unknown")], "10.0.0.5"),  # not an address: the peer stays
    ("10.0.0.5", [(XFF, b" 203.0.113.9:4711 ")], "203.0.113.9"),
    ("10.0.0.5", [(FWD, b"for=6.6.6.6")], "10.0.0.5"),  # not the header these proxies write
    ("10.0.0.5", [], "10.0.0.5"),
    ("not-an-ip", [(XFF, b"6.6.6.6")], "not-an-ip"),
])
def test_x_forwarded_for_from_trusted_proxies(peer: str, headers: list[tuple[bytes, bytes]], expected: str) -> None:
    assert TrustedProxies(["10.0.0.0/8"]).client(peer, headers) == expected


@pytest.mark.parametrize(("value", "expected"), [
    (b'for="[2001:db8::7]:4711";proto=https', "2001:db8::7"),
    (b"for=192.0.2.60;proto=http;by=203.0.113.43", "192.0.2.60"),
    (b"For=192.0.2.1, for=198.51.100.2", "198.51.100.2"),
    (b'for="_hidden"', "10.0.0.5"),  # an obfuscated identifier names no address
    (b"proto=https", "10.0.0.5"),
])
def test_rfc_7239_forwarded_from_trusted_proxies(value: bytes, expected: str) -> None:
    assert TrustedProxies(["10.0.0.0/8"], "forwarded").client("10.0.0.5", [(FWD, value)]) == expected


def test_no_trusted_proxy_trusts_no_one() -> None:
    proxies = TrustedProxies([])
    assert not proxies
    scope = {"type": "http", "client": ("127.0.0.1", 5000), "headers": [(XFF, b"6.6.6.6")]}
    proxies.rewrite(scope)
    assert scope["client"] == ("127.0.0.1", 5000)


def test_rewrite_puts_the_forwarded_client_in_the_scope() -> None:
    scope = {"type": "http", "client": ("127.0.0.1", 5000), "headers": [(XFF, b"2001:db8::1")]}
    TrustedProxies(["127.0.0.1"]).rewrite(scope)
    assert scope["client"] == ("2001:db8::1", 0)


def test_an_unknown_forwarded_header_is_refused() -> None:
    with pytest.raises(ValueError, match="x-forwarded-for or forwarded"):
        TrustedProxies([], "x-real-ip")


def test_request_ids_are_ours_and_a_clients_is_kept_only_when_safe() -> None:
    assert new_request_id() != new_request_id()
    assert len(new_request_id()) == 32
    assert client_request_id("abc-123_X.y") == "abc-123_X.y"
    for odd in (None, "", "a b", "x" * 65, "é", "a\nb", "ab\n"):
        assert client_request_id(odd) is None


def test_a_trusted_proxy_names_the_scheme_the_client_used() -> None:
    scope = {"client": ("127.0.0.1", 5000), "scheme": "http",
             "headers": [(b"x-forwarded-proto", b"http, https"), (b"x-forwarded-for", b"192.0.2.7")]}
    TrustedProxies(["127.0.0.1"]).rewrite(scope)
    assert scope["scheme"] == "https"
    assert scope["client"] == ("192.0.2.7", 0)


@pytest.mark.parametrize(("trusted", "proto"), [([], b"https"), (["10.0.0.0/8"], b"https"),
                                                (["127.0.0.1"], b"gopher")])
def test_x_forwarded_proto_is_ignored_unless_a_trusted_proxy_sends_a_known_scheme(
        trusted: list[str], proto: bytes) -> None:
    scope = {"client": ("127.0.0.1", 5000), "scheme": "http", "headers": [(b"x-forwarded-proto", proto)]}
    TrustedProxies(trusted).rewrite(scope)
    assert scope["scheme"] == "http"
