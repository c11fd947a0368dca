"""The HTTP server ``qoss serve`` runs: uvicorn's, told first when it is asked to stop."""

from __future__ import annotations

from types import FrameType

import uvicorn
from fastapi import FastAPI

__all__ = ["serve"]


class _Server(uvicorn.Server):
    """On SIGTERM or SIGINT the application is told it is draining before uvicorn stops taking
    requests: open event streams end then (their clients resume elsewhere with Last-Event-ID),
    so the shutdown waits only for the requests in progress, not for every follower to leave."""

    def __init__(self, config: uvicorn.Config, application: FastAPI) -> None:
        super().__init__(config)
        self._application = application

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._application.state.draining = True
        super().handle_exit(sig, frame)


def serve(application: FastAPI, *, host: str, port: int, log_level: str, backlog: int) -> None:
    """Serve ``application`` until asked to stop (httptools; forwarded headers are qoss's own business)."""
    config = uvicorn.Config(application, host=host, port=port, log_level=log_level, http="httptools",
                            proxy_headers=False, backlog=backlog)
    _Server(config, application).run()
