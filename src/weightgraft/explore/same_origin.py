"""Which requests may reach the explore app: only those a page served by this app (or a local
tool) sends. Another site open in the same browser must not drive the models: a ``Host`` that
is not the served address (DNS rebinding) gets 403, so does a foreign ``Origin``, and a POST
must declare ``application/json`` (a content type no browser sends cross-site without asking
the server first)."""

from __future__ import annotations

import json
import socket
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from weightgraft.explore.serve import is_loopback

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def served_hosts(host: str, port: int) -> frozenset[str]:
    """The ``Host`` header values a browser sends for this server: the loopback names on a
    loopback bind; the bound address too otherwise, and for a wildcard bind this machine's
    name and addresses. Port 80 may be left out of a ``Host``, so both forms are kept."""
    names = set(LOOPBACK_NAMES)
    if not is_loopback(host):
        names.add(_bracketed(host))
        if host in ("0.0.0.0", "::", ""):
            name = socket.gethostname()
            names.add(name)
            try:
                names.update(_bracketed(a) for a in socket.gethostbyname_ex(name)[2])
            except OSError:
                pass
    hosts = {f"{n}:{port}" for n in names}
    if port == 80:
        hosts |= names
    return frozenset(h.lower() for h in hosts)


class Guard:
    """ASGI middleware: refuse (403 / 415, one JSON line) what another site could send."""

    def __init__(self, app: ASGIApp, hosts: Iterable[str]) -> None:
        self.app = app
        self.hosts = frozenset(h.lower() for h in hosts)
        self.origins = frozenset(f"http://{h}" for h in self.hosts)

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        """``(status, reason)`` when this request must not reach the app, else ``None``."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host", "").strip().lower()
        if host not in self.hosts:
            return 403, f"Host {host or '(none)'!r} is not this server's address ({', '.join(sorted(self.hosts))})"
        origin = headers.get("origin")
        if origin is not None and origin.strip().lower().rstrip("/") not in self.origins:
            return 403, f"requests from {origin!r} are refused: only pages this server serves may call it"
        if scope.get("method") == "POST":
            media = headers.get("content-type", "").split(";")[0].strip().lower()
            if media != "application/json":
                return 415, f"Content-Type must be application/json (got {media or 'none'!r})"
        return None

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] == "http":
            refused = self.refusal(scope)
            if refused is not None:
                status, reason = refused
                body = json.dumps({"error": reason}).encode()
                await send({"type": "http.response.start", "status": status,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
