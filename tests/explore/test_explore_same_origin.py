"""``weightgraft explore`` answers only its own page: a foreign ``Host`` (DNS rebinding) or
``Origin`` gets 403, a POST that is not ``application/json`` (what a cross-site form or
``fetch`` sends without a preflight) gets 415, on every route; the served address gets through."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from weightgraft.explore.app import create_app
from weightgraft.explore.same_origin import served_hosts
from weightgraft.explore.session import Explorer

PORT = 8765
GRAFT = {"prompt": "Keanu Reeves starred in a movie with", "k": 3}


@pytest.fixture(scope="module")
def app(tiny_pair, tiny_tok):
    pre, sft = tiny_pair("llama")
    return create_app(Explorer({"pre": pre, "sft": sft}, tiny_tok), address=("127.0.0.1", PORT))


@pytest.mark.parametrize("host", [f"127.0.0.1:{PORT}", f"localhost:{PORT}", f"[::1]:{PORT}", f"LOCALHOST:{PORT}"])
def test_the_served_address_gets_through(app, host):
    client = TestClient(app, base_url=f"http://{host}")
    assert client.get("/api/info").status_code == 200
    res = client.post("/api/graft", json=GRAFT, headers={"origin": f"http://{host.lower()}"})
    assert res.status_code == 200, res.text
    # a JSON content type with parameters is still JSON
    res = client.post("/api/tokens", content=b'{"prompt": "ab"}',
                      headers={"content-type": "application/json; charset=utf-8"})
    assert res.status_code == 200, res.text


@pytest.mark.parametrize("host", ["attacker.example", f"attacker.example:{PORT}", "127.0.0.1:9999",
                                  "127.0.0.1", "localhost", f"127.0.0.2:{PORT}", ""])
@pytest.mark.parametrize("method,url", [("GET", "/"), ("GET", "/api/info"), ("GET", "/api/run"),
                                        ("POST", "/api/graft"), ("GET", "/static/main.js")])
def test_a_foreign_host_is_refused(app, host, method, url):
    client = TestClient(app, base_url=f"http://127.0.0.1:{PORT}")
    res = client.request(method, url, json=GRAFT if method == "POST" else None, headers={"host": host})
    assert res.status_code == 403, (host, url, res.text)
    assert "is not this server's address" in res.json()["error"]


@pytest.mark.parametrize("origin", ["https://evil.example", f"http://evil.example:{PORT}", "null",
                                    f"https://127.0.0.1:{PORT}", "http://127.0.0.1:9999", f"http://127.0.0.1:{PORT}.evil.example"])
def test_a_foreign_origin_is_refused(app, origin):
    client = TestClient(app, base_url=f"http://127.0.0.1:{PORT}")
    for res in (client.post("/api/graft", json=GRAFT, headers={"origin": origin}),
                client.get("/api/info", headers={"origin": origin})):
        assert res.status_code == 403, (origin, res.text)
        assert "refused" in res.json()["error"]


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/jsonp"])
def test_a_post_that_is_not_json_is_refused(app, content_type):
    client = TestClient(app, base_url=f"http://127.0.0.1:{PORT}")
    headers = {} if content_type is None else {"content-type": content_type}
    for url in ("/api/graft", "/api/tokens"):
        res = client.post(url, content=b'{"prompt": "Keanu Reeves starred in a movie with"}', headers=headers)
        assert res.status_code == 415, (content_type, res.text)
        assert "application/json" in res.json()["error"]


def test_served_hosts():
    assert served_hosts("127.0.0.1", 8000) == {"127.0.0.1:8000", "localhost:8000", "[::1]:8000"}
    assert "[::1]:80" in served_hosts("::1", 80) and "localhost" in served_hosts("localhost", 80)
    assert "192.168.1.5:8000" in served_hosts("192.168.1.5", 8000)
    assert "attacker.example:8000" not in served_hosts("0.0.0.0", 8000)
