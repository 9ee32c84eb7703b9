"""Serving the explore app with uvicorn: loopback by default, a warning for any other host (the
app has no authentication: whoever reaches the port can run the models)."""

from __future__ import annotations

import ipaddress
import socket
import sys
from typing import Any


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (for ``--port 0`` and tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def pick_port(host: str, port: int) -> int:
    """``port``, or a free one for 0 (chosen before the app is made: it checks ``Host``)."""
    return port or free_port(host if is_loopback(host) else "0.0.0.0")


def serve(app: Any, host: str, port: int) -> None:
    """Run ``app`` until Ctrl-C, after printing its address (and a warning off loopback)."""
    import uvicorn

    if not is_loopback(host):
        print(f"warning: --host {host} is not loopback: anyone who can reach this port can run "
              "the models (there is no authentication)", file=sys.stderr, flush=True)
    shown = f"[{host}]" if ":" in host else host
    print(f"weightgraft explore: http://{shown}:{port}/  (Ctrl-C stops)", flush=True)
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).run()
