"""The explore app's routes (Starlette): the page and its static files, and the JSON API the page
uses. Every refusal is a 4xx JSON ``{"error": "one line"}``; an unexpected failure is a 500
JSON with one line, never a traceback page. Model passes run one at a time in a worker thread,
in a bounded line where a page's superseded strokes are dropped, or stopped if running (``work``).
Only requests for the served address, from no other site's page, get through (``guard``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from importlib.resources import files
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from weightgraft.explore.artifacts import LocalizeView, RunView
from weightgraft.explore.expert_view import ExpertMapView
from weightgraft.explore.opening import DEFAULT, Opening
from weightgraft.explore.requests import GraftRequest, Limits, RequestError, TokensRequest, parse
from weightgraft.explore.same_origin import Guard, served_hosts
from weightgraft.explore.session import Explorer
from weightgraft.explore.stroke_line import StrokeLine

DEFAULT_PORT = 8765
STATIC = Path(str(files("weightgraft.explore") / "static"))


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": " ".join(str(message).split())}, status_code=status)


async def _drain(stream: AsyncIterator[bytes], size: int, limit: int, timeout: float) -> None:
    """Read and drop what is left of a body refused as too large, up to ``limit`` bytes in all
    (``size`` already read), each chunk within ``timeout`` seconds. The server closes the
    connection after the 413 when the client asked it to (``Connection: close``, as urllib
    does): unread bytes then make the kernel reset the connection, and the client gets that
    reset instead of the 413."""
    while size <= limit:
        try:
            size += len(await asyncio.wait_for(stream.__anext__(), timeout))
        except (StopAsyncIteration, asyncio.TimeoutError, ClientDisconnect):
            return


async def _body(request: Request, limits: Limits) -> Any:
    """The request's JSON body, refused past ``limits.max_body_bytes`` (read in chunks, not
    trusted from Content-Length alone; the rest of a refused body is drained, ``_drain``) or
    when a chunk takes over ``limits.body_timeout_s`` to arrive (a body shorter than its
    Content-Length would otherwise hold the connection forever)."""
    limit, timeout, drain = limits.max_body_bytes, limits.body_timeout_s, limits.max_drain_bytes
    stream = request.stream().__aiter__()
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        if int(declared) <= drain and request.headers.get("expect", "").lower() != "100-continue":
            await _drain(stream, 0, drain, timeout)
        raise RequestError(f"request body of {declared} bytes; the limit is {limit}", 413)
    chunks, size = [], 0
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), timeout)
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            raise RequestError(f"the request body stopped arriving ({size} bytes in, none for {timeout:g} s)", 408) from None
        size += len(chunk)
        if size > limit:
            await _drain(stream, size, drain, timeout)
            raise RequestError(f"request body over the limit of {limit} bytes", 413)
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks) or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(f"the request body is not JSON: {exc}") from None


def create_app(explorer: Explorer, run: RunView | None = None, localize: LocalizeView | None = None,
               address: tuple[str, int] = ("127.0.0.1", DEFAULT_PORT), opening: Opening | None = None,
               experts: ExpertMapView | None = None) -> Starlette:
    """The ASGI app over one loaded model set (and optionally a run's, a localize run's and an
    expert map's outputs, read once here; a map the models' banks do not fit is refused now),
    answering requests addressed to ``address`` (host, port) only. The page opens on ``opening``
    (``opening.opening_example``; the built-in, unchecked prompt if None)."""
    work = StrokeLine(explorer.limits.max_waiting)
    run_json = run.to_json() if run is not None else None
    localize_json = localize.to_json() if localize is not None else None
    if experts is not None:
        experts.check(explorer.slot_list)
    experts_json = experts.to_json() if experts is not None else None

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    async def info(request: Request) -> Response:
        return JSONResponse({**explorer.info(), "run": run_json is not None, "localize": localize_json is not None,
                             "experts": experts_json is not None, "opening": (opening or DEFAULT).to_json()})

    async def tokens(request: Request) -> Response:
        req = parse(TokensRequest, await _body(request, explorer.limits))
        toks = await run_in_threadpool(explorer.tokens, req)
        return JSONResponse({"tokens": toks, "anchor": explorer.anchor(req, toks)})

    async def graft(request: Request) -> Response:
        req = parse(GraftRequest, await _body(request, explorer.limits))
        check = work.check(req.page, req.seq)
        return JSONResponse(await work.run(req.page, req.seq, lambda: run_in_threadpool(explorer.graft, req, check)))

    async def run_info(request: Request) -> Response:
        if run_json is None:
            raise RequestError("no run: start explore with --run DIR", 404)
        return JSONResponse(run_json)

    async def run_figure(request: Request) -> Response:
        if run is None:
            raise RequestError("no run: start explore with --run DIR", 404)
        try:
            path = run.figure(int(request.path_params["index"]))
        except IndexError:
            raise RequestError("no such figure", 404) from None
        return FileResponse(path, media_type="image/png")

    async def localize_info(request: Request) -> Response:
        if localize_json is None:
            raise RequestError("no localize run: start explore with --localize DIR", 404)
        return JSONResponse(localize_json)

    async def experts_info(request: Request) -> Response:
        if experts_json is None:
            raise RequestError("no expert map: start explore with --experts DIR", 404)
        return JSONResponse(experts_json)

    async def refused(request: Request, exc: Exception) -> Response:
        return _error(str(exc), getattr(exc, "status", 400))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return _error(exc.detail or "error", exc.status_code)

    async def failed(request: Request, exc: Exception) -> Response:
        return _error(f"internal error: {type(exc).__name__}: {exc}", 500)

    routes = [
        Route("/", index),
        Route("/api/info", info),
        Route("/api/tokens", tokens, methods=["POST"]),
        Route("/api/graft", graft, methods=["POST"]),
        Route("/api/run", run_info),
        Route("/api/run/figures/{index:int}", run_figure),
        Route("/api/localize", localize_info),
        Route("/api/experts", experts_info),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(Guard, hosts=served_hosts(*address))], exception_handlers={
        RequestError: refused, HTTPException: http_error, Exception: failed,
    })
