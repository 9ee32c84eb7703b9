"""``weightgraft explore``'s work is bounded: a page's superseded strokes are dropped while they
wait (latest wins), the line of waiting grafts is bounded, deep selectors and long answers get
a 400 (not a RecursionError), numbers are strict, and a body that stops short of its
Content-Length is answered 408 instead of holding the connection."""

from __future__ import annotations

import json

import anyio
import pytest
from starlette.testclient import TestClient

from weightgraft.explore.app import create_app
from weightgraft.explore.requests import Limits, RequestError
from weightgraft.explore.session import Explorer
from weightgraft.explore.stroke_line import StrokeLine

PROMPT = "Keanu Reeves starred in a movie with"
HOST = "127.0.0.1:8765"


@pytest.fixture(scope="module")
def models(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    return {"pre": pre, "sft": sft}, tiny_tok


@pytest.fixture(scope="module")
def client(models):
    return TestClient(create_app(Explorer(*models)), base_url=f"http://{HOST}")


def _line(max_waiting: int, strokes: list[tuple[str | None, int | None]]) -> tuple[list[str], list[str]]:
    """Run a blocking first job, queue ``strokes`` behind it, then let it finish: what ran, in
    order, and how each queued stroke was answered."""
    work, ran, answers = StrokeLine(max_waiting), [], []

    async def main() -> None:
        release = anyio.Event()

        async def first() -> str:
            await release.wait()
            ran.append("first")
            return "first"

        async def stroke(page: str | None, seq: int | None, i: int) -> None:
            async def job() -> str:
                ran.append(f"{page}:{seq}")
                return "ok"
            try:
                answers[i] = await work.run(page, seq, job)
            except RequestError as exc:
                answers[i] = str(exc.status)

        answers.extend([""] * len(strokes))
        with anyio.fail_after(10):
            await line(first, stroke, release)

    async def line(first, stroke, release) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(work.run, None, None, first)
            await anyio.sleep(0.01)
            for i, (page, seq) in enumerate(strokes):
                tg.start_soon(stroke, page, seq, i)
                await anyio.sleep(0.01)
            release.set()

    anyio.run(main)
    return ran, answers


def test_a_pages_superseded_strokes_do_not_run():
    ran, answers = _line(8, [("a", 1), ("a", 2), ("b", 1), ("a", 3), ("a", 0)])
    # page a's strokes 1, 2 and the late 0 were overtaken by 3 while they waited; page b is its own
    assert ran == ["first", "b:1", "a:3"]
    assert answers == ["409", "409", "ok", "ok", "409"]
    # without page names nothing is dropped (the null: every stroke runs)
    ran, answers = _line(8, [(None, 1), (None, 2), (None, 3)])
    assert ran == ["first", "None:1", "None:2", "None:3"] and answers == ["ok"] * 3


def test_the_line_is_bounded():
    ran, answers = _line(2, [("a", 1), ("b", 1), ("c", 1), ("d", 1)])
    assert answers == ["ok", "ok", "503", "503"] and ran == ["first", "a:1", "b:1"]
    # a page's own superseded strokes do not fill the line: its 30th stroke runs
    ran, answers = _line(2, [("a", i) for i in range(1, 31)])
    assert ran == ["first", "a:30"] and answers == ["409"] * 29 + ["ok"]


@pytest.mark.parametrize("positions", ["~" * 20000 + "last", "(" * 5000 + "last" + ")" * 5000, "~(" * 40 + "last" + ")" * 40])
def test_deep_selectors_are_a_400(client, positions):
    res = client.post("/api/graft", json={"prompt": PROMPT, "rules": [{"model": "sft", "positions": positions}]})
    assert res.status_code == 400 and "deep" in res.json()["error"], res.text[:300]


def test_selectors_within_the_depth_run(client):
    for positions in ["~" * 10 + "last", "(" * 30 + "last" + ")" * 30, "~~(last)"]:
        res = client.post("/api/graft", json={"prompt": PROMPT, "rules": [{"model": "sft", "positions": positions}], "k": 2})
        assert res.status_code == 200, res.text


@pytest.mark.parametrize("body,status,match", [
    ({"answer": "x" * 201}, 400, "at most 200"),
    ({"k": True}, 400, "k"),
    ({"k": 3.0}, 400, "k"),
    ({"k": "3"}, 400, "k"),
    ({"cells": [{"position": True, "slot": "embed", "model": "sft"}]}, 400, "position"),
    ({"seq": True, "page": "p"}, 400, "seq"),
    ({"page": "p" * 65, "seq": 1}, 400, "page"),
])
def test_strict_and_bounded_fields(client, body, status, match):
    res = client.post("/api/graft", json={"prompt": PROMPT, **body})
    assert res.status_code == status and match in res.json()["error"], res.text
    assert "Value error" not in res.json()["error"]


def test_the_longest_answer_and_a_paged_stroke_run(client):
    res = client.post("/api/graft", json={"prompt": PROMPT, "answer": "x" * 200, "k": 2, "page": "p1", "seq": 5})
    assert res.status_code == 200, res.text


def test_a_body_shorter_than_its_content_length_times_out(models):
    """The client says 200 bytes, sends 20 and goes quiet: 408 after the timeout, one line."""
    app = create_app(Explorer(*models, limits=Limits(body_timeout_s=0.3)))
    sent: list[dict] = []
    part = b'{"prompt": "Keanu Re'

    async def main() -> None:
        calls = 0

        async def receive() -> dict:
            nonlocal calls
            calls += 1
            if calls == 1:
                return {"type": "http.request", "body": part, "more_body": True}
            await anyio.sleep_forever()
            return {}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/api/graft", "raw_path": b"/api/graft", "query_string": b"",
                 "root_path": "", "server": ("127.0.0.1", 8765), "client": ("127.0.0.1", 5000),
                 "headers": [(b"host", HOST.encode()), (b"content-type", b"application/json"),
                             (b"content-length", b"200")]}
        with anyio.fail_after(10):
            await app(scope, receive, send)

    anyio.run(main)
    assert sent[0]["status"] == 408
    error = json.loads(sent[1]["body"])["error"]
    assert "stopped arriving" in error and f"{len(part)} bytes" in error
