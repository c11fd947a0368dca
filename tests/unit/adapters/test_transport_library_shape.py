"""What app/adapters/agent/transport.py relies on in httptools beyond what uvicorn uses of it,
checked against the pinned version, and its answers against httpx's (the public path,
QOSS_FAST_PATHS=false) on the same replies: an upgrade that changes any of it fails here,
naming httptools and its version."""

from __future__ import annotations

from typing import Any

import httptools
import pytest

from app.adapters.agent import transport
from app.adapters.agent.transport import post_message
from tests.fixtures.library_pins import assert_pinned
from tests.unit.adapters.test_agent_transport import scripted_peer

HTTPTOOLS = assert_pinned("httptools", "app/adapters/agent/transport.py")
assert_pinned("httpx", "app/adapters/agent/transport.py (its public path)")


def _shape(ok: bool, what: str) -> None:
    assert ok, (f"httptools {HTTPTOOLS}: {what} changed; app/adapters/agent/transport.py relies on it "
                "(QOSS_FAST_PATHS=false avoids it)")


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.parser: httptools.HttpResponseParser | None = None

    def on_header(self, name: bytes, value: bytes) -> None:
        self.calls.append(("header", (name, value)))

    def on_headers_complete(self) -> None:  # where the transport asks whether to keep the connection
        assert self.parser is not None
        self.calls.append(("headers_complete", self.parser.should_keep_alive()))

    def on_body(self, chunk: bytes) -> None:
        self.calls.append(("body", chunk))

    def on_message_complete(self) -> None:
        self.calls.append(("complete", None))


def test_the_response_parser_calls_back_and_reports_status_and_keep_alive() -> None:
    recorder = _Recorder()
    recorder.parser = parser = httptools.HttpResponseParser(recorder)
    parser.feed_data(b"HTTP/1.1 201 Created\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhel")
    parser.feed_data(b"lo")
    _shape(recorder.calls == [("header", (b"Content-Length", b"5")), ("header", (b"X-A", b"b")),
                              ("headers_complete", True), ("body", b"hel"), ("body", b"lo"), ("complete", None)],
           f"HttpResponseParser's callbacks (on_header, on_headers_complete, on_body, on_message_complete): "
           f"{recorder.calls}")
    _shape(parser.get_status_code() == 201, "HttpResponseParser.get_status_code()")


@pytest.mark.parametrize(("head", "keep"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n", False),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n", False),
    (b"HTTP/1.1 200 OK\r\n\r\n", False),  # read until close: never kept
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", True),
])
def test_keep_alive_follows_the_answers_framing(head: bytes, keep: bool) -> None:
    recorder = _Recorder()
    recorder.parser = parser = httptools.HttpResponseParser(recorder)
    parser.feed_data(head)
    _shape(("headers_complete", keep) in recorder.calls, f"should_keep_alive() for {head!r}: {recorder.calls}")


def test_garbage_is_an_http_parser_error() -> None:
    parser = httptools.HttpResponseParser(_Recorder())
    with pytest.raises(httptools.HttpParserError):
        parser.feed_data(b"SSH-2.0-OpenSSH_9.2\r\n")


_OK = b'{"message":"olleh"}'
_REPLIES = {
    "framed": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 19\r\n\r\n" + _OK,
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n" + _OK[:5] + b"\r\ne\r\n" + _OK[5:]
               + b"\r\n0\r\n\r\n",
    "until-close": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + _OK,
    "http-1.0": b"HTTP/1.0 200 OK\r\n\r\n" + _OK,
    "rejected": b"HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\n{}",
    "refused": b'HTTP/1.1 409 Conflict\r\nContent-Length: 37\r\n\r\n{"error":"Conflict","detail":"taken"}',
    "not json": b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 5\r\n\r\noops!",
    "malformed": b'HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n{"message":1}',
    "cut short": b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{",
    "not http": b"SSH-2.0-OpenSSH_9.2\r\n",
}


def _outcome(answer: bytes, fast_paths: bool) -> tuple[str, Any]:
    transport._KEPT.close()
    url, thread, server, _ = scripted_peer([[answer]])
    with server:
        try:
            return "answer", post_message(url, b"hello", timeout=3.0, fast_paths=fast_paths)
        except Exception as exc:  # compared, whatever it is
            return type(exc).__name__, (getattr(exc, "status", None), getattr(exc, "remote_detail", None))
        finally:
            thread.join(timeout=5)
            transport._KEPT.close()


@pytest.mark.parametrize("reply", list(_REPLIES))
def test_the_fast_path_answers_as_httpx_does(reply: str) -> None:
    fast, public = _outcome(_REPLIES[reply], True), _outcome(_REPLIES[reply], False)
    _shape(fast == public, f"the answer to a {reply!r} reply: fast path {fast}, httpx {public}")
