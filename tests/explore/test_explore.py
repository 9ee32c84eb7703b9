"""``weightgraft explore``: the HTTP API against the real app on tiny models (equal to
``wg.graft``, explicit cells, refusals, no client paths), a run's and a localize run's outputs
(the page itself in a browser: test_explore_browser.py)."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch
from starlette.testclient import TestClient

import weightgraft as wg
from weightgraft.explore.app import create_app
from weightgraft.explore.requests import Limits
from weightgraft.explore.serve import is_loopback
from weightgraft.explore.session import Explorer

PROMPT = "Keanu Reeves starred in a movie with"
SERVED = "http://127.0.0.1:8765"  # the address create_app answers by default
JSON = {"content-type": "application/json"}
SPANS = {"actor": "Keanu Reeves", "relation": "starred in"}


@pytest.fixture(scope="module")
def pre_sft(tiny_pair):
    return tiny_pair("llama")


@pytest.fixture(scope="module")
def client(pre_sft, tiny_tok):
    pre, sft = pre_sft
    return TestClient(base_url=SERVED, app=create_app(Explorer({"pre": pre, "sft": sft}, tiny_tok)))


def _expected(pre_sft, tok, rules, base="pre", spans=SPANS):
    pre, sft = pre_sft
    return wg.graft({"pre": pre, "sft": sft}, tok, [PROMPT], rules, base=base, spans=[spans])


def _same_top(got, out, k):
    """The app's top-k is the top-k of wg.graft's logits (tokens as ``out.top`` names them)."""
    probs = torch.softmax(out.logits[0], dim=-1)
    values, ids = probs.topk(k)
    assert [e["token_id"] for e in got] == ids.tolist()
    assert [e["token"] for e in got] == [t for t, _ in out.top(k)[0]]
    tol = 1e-12 if out.logits.dtype == torch.float64 else 1e-6  # float32: a 3-row batch rounds apart
    assert [e["prob"] for e in got] == pytest.approx(values.tolist(), abs=tol)


@pytest.mark.parametrize("rules,base", [
    ([{"model": "sft", "positions": "last", "components": "body"}], "pre"),
    ([{"model": "sft", "positions": "actor+last", "layers": "last_half", "components": "o+ffn"}], "pre"),
    ([{"model": "sft", "positions": "first_entity"}, {"model": "pre", "positions": "last", "components": "attn"}], "pre"),
    ([{"model": "pre", "positions": "~relation", "components": "all"}], "sft"),
    ([{"model": "sft", "positions": "last", "layers": "2..3", "components": "o", "heads": "1"}], "pre"),
])
def test_graft_equals_wg_graft(client, pre_sft, tiny_tok, rules, base):
    body = {"prompt": PROMPT, "spans": SPANS, "rules": rules, "base": base, "answer": "Tom", "k": 6}
    res = client.post("/api/graft", json=body)
    assert res.status_code == 200, res.text
    got = res.json()
    out = _expected(pre_sft, tiny_tok, [wg.Rule(**r) for r in rules], base)
    _same_top(got["top"]["graft"], out, 6)
    _same_top(got["top"]["pre"], _expected(pre_sft, tiny_tok, [], "pre"), 6)
    _same_top(got["top"]["sft"], _expected(pre_sft, tiny_tok, [], "sft"), 6)
    answer = tiny_tok(" Tom", add_special_tokens=False)["input_ids"][0]
    logits = out.logits[0]
    assert got["answer"]["token_id"] == answer
    assert got["answer"]["prob"]["graft"] == pytest.approx(float(torch.softmax(logits, -1)[answer]), abs=1e-9)
    assert got["answer"]["rank"]["graft"] == int((logits > logits[answer]).sum())
    # the map the pass ran is wg.graft's, in the app's role order (pre, sft)
    order = torch.tensor([0, 1]) if base == "pre" else torch.tensor([1, 0])
    assert torch.equal(torch.tensor(got["map"]["source"]), order[out.source[0]])
    assert [t["token_id"] for t in got["tokens"]] == out.input_ids[0].tolist()


def test_explicit_cells_equal_the_rules_they_spell_out(client, pre_sft, tiny_tok):
    rule = wg.Rule(model="sft", positions="actor+last", layers="first_half", components="attn+o")
    out = _expected(pre_sft, tiny_tok, [rule])
    names = wg.slots(pre_sft[0])
    cells = [{"position": int(t), "slot": names[int(s)], "model": "sft"} for t, s in (out.source[0] == 1).nonzero()]
    assert cells
    res = client.post("/api/graft", json={"prompt": PROMPT, "cells": cells, "k": 5})
    assert res.status_code == 200, res.text
    _same_top(res.json()["top"]["graft"], out, 5)
    # the same cells over base sft with everything else given back to pre
    rest = [{"position": int(t), "slot": names[int(s)], "model": "pre"} for t, s in (out.source[0] == 0).nonzero()]
    flipped = client.post("/api/graft", json={"prompt": PROMPT, "cells": rest, "base": "sft", "k": 5}).json()
    _same_top(flipped["top"]["graft"], out, 5)
    # a later assignment of the same cell wins
    again = client.post("/api/graft", json={"prompt": PROMPT, "k": 5, "cells": cells + [
        {**c, "model": "pre"} for c in cells]}).json()
    _same_top(again["top"]["graft"], _expected(pre_sft, tiny_tok, []), 5)
    assert again["top"]["graft"] != res.json()["top"]["graft"]


def test_tokens_endpoint_lists_wg_tokens(client, tiny_tok):
    res = client.post("/api/tokens", json={"prompt": PROMPT, "spans": SPANS})
    assert res.status_code == 200, res.text
    rows = res.json()["tokens"]
    table = wg.tokens(tiny_tok, PROMPT, spans=SPANS)
    assert [r["label"] for r in rows] == table["label"].tolist()
    assert [r["token"] for r in rows] == table["token"].tolist()
    # selectors name exactly the positions the selector language picks
    from weightgraft.schemes.selectors import select_positions

    enc = tiny_tok(PROMPT, return_offsets_mapping=True)
    chars = {k: (PROMPT.find(v), PROMPT.find(v) + len(v)) for k, v in SPANS.items()}
    for name in ("actor", "first_entity", "relation", "last"):
        picked = [r["position"] for r in rows if name in r["selectors"]]
        assert picked == select_positions(name, enc["offset_mapping"], chars)


@pytest.mark.parametrize("body,match", [
    ({"prompt": ""}, "prompt"),
    ({"prompt": PROMPT, "path": "/etc/passwd"}, "path: unknown field"),
    ({"prompt": PROMPT, "run": "runs/demo"}, "run: unknown field"),
    ({"prompt": PROMPT, "rules": [{"model": "sft", "positions": "nope"}]}, "nope"),
    ({"prompt": PROMPT, "rules": [{"model": "zzz"}]}, "zzz"),
    ({"prompt": PROMPT, "rules": [{"model": "sft", "layers": "9..0"}]}, "layer"),
    ({"prompt": PROMPT, "rules": [], "cells": []}, "not both"),
    ({"prompt": PROMPT, "cells": [{"position": 99, "slot": "embed", "model": "sft"}]}, "position 99"),
    ({"prompt": PROMPT, "cells": [{"position": -1, "slot": "embed", "model": "sft"}]}, "position -1"),
    ({"prompt": PROMPT, "cells": [{"position": 0, "slot": "layers.9.q", "model": "sft"}]}, "unknown slot"),
    ({"prompt": PROMPT, "cells": [{"position": 0, "slot": "embed", "model": "other"}]}, "other"),
    ({"prompt": PROMPT, "cells": [{"position": 0, "slot": "embed"}]}, "model"),
    ({"prompt": PROMPT, "base": "task"}, "base"),
    ({"prompt": PROMPT, "k": 0}, "k"),
    ({"prompt": PROMPT, "k": 500}, "at most"),
    ({"prompt": PROMPT, "spans": {"actor": "Meryl Streep"}}, "Meryl Streep"),
    ({"prompt": PROMPT, "spans": {"../x": "Keanu"}}, "identifier"),
    ({"prompt": 5}, "prompt"),
])
def test_malformed_requests_get_a_one_line_4xx(client, body, match):
    res = client.post("/api/graft", json=body)
    assert res.status_code == 400, res.text
    error = res.json()["error"]
    assert match in error and "\n" not in error and "Traceback" not in error


def test_bodies_that_are_not_requests(pre_sft, tiny_tok):
    pre, sft = pre_sft
    limits = Limits(max_body_bytes=2000, max_prompt_chars=60, max_tokens=40, max_k=20)
    client = TestClient(base_url=SERVED, app=create_app(Explorer({"pre": pre, "sft": sft}, tiny_tok, limits)))
    cases = [
        (client.post("/api/graft", content=b"{not json", headers=JSON), 400, "not JSON"),
        (client.post("/api/graft", json=[PROMPT]), 400, "JSON object"),
        (client.post("/api/graft", content=b"", headers=JSON), 400, "JSON object"),
        (client.post("/api/graft", json={"prompt": "x" * 3000}), 413, "limit"),
        (client.post("/api/tokens", json={"prompt": "x" * 61}), 400, "at most 60"),
        (client.post("/api/tokens", json={"prompt": "ab " * 15}), 400, "at most 40"),
        (client.get("/api/graft"), 405, ""),
        (client.get("/api/nothing"), 404, ""),
        (client.get("/api/run"), 404, "--run"),
        (client.get("/api/localize"), 404, "--localize"),
        (client.get("/api/run/figures/0"), 404, "--run"),
    ]
    for res, status, match in cases:
        assert res.status_code == status, (res.request.url, res.text)
        assert match in res.json()["error"], res.text
    # a body streamed without Content-Length is cut off at the limit too
    chunks = iter([b'{"prompt": "', b"x" * 1500, b"y" * 1500, b'"}'])
    res = client.post("/api/graft", content=chunks, headers={"content-type": "application/json"})
    assert res.status_code == 413


def _over_limit_app(pre_sft, tok, port: int, **limits):
    pre, sft = pre_sft
    explorer = Explorer({"pre": pre, "sft": sft}, tok, Limits(max_body_bytes=2000, **limits))
    return create_app(explorer, address=("127.0.0.1", port))


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_every_over_limit_body_gets_its_413_over_a_socket(pre_sft, tiny_tok, chunked):
    """A client that sends all of an 8 MiB body and asks for the connection to be closed (as
    urllib does) gets its 413 every time, not ``Connection reset by peer`` / ``Broken pipe``:
    bytes left unread when the server closes make the kernel reset the connection."""
    import http.client

    import browser

    from weightgraft.explore.serve import free_port

    port = free_port()
    body = b'{"prompt": "' + b"x" * (8 << 20) + b'"}'
    got = []
    with browser.served(_over_limit_app(pre_sft, tiny_tok, port), port):
        for _ in range(20):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            content = iter([body[i:i + (1 << 16)] for i in range(0, len(body), 1 << 16)]) if chunked else body
            try:
                conn.request("POST", "/api/graft", body=content, headers={**JSON, "Connection": "close"},
                             encode_chunked=chunked)
                res = conn.getresponse()
                got.append((res.status, "limit" in res.read().decode()))
            except OSError as exc:
                got.append((type(exc).__name__, str(exc)))
            finally:
                conn.close()
    assert got == [(413, True)] * 20, Counter(got)


def test_an_over_limit_body_not_sent_gets_its_413(pre_sft, tiny_tok):
    """A client that waits for the server's word before sending (``Expect: 100-continue``) gets
    the 413 at once, never a 100; one that stops halfway gets it when its body stops arriving."""
    import socket

    import browser

    from weightgraft.explore.serve import free_port

    port = free_port()
    head = (f"POST /api/graft HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {1 << 20}\r\nConnection: close\r\n").encode()
    with browser.served(_over_limit_app(pre_sft, tiny_tok, port, body_timeout_s=0.3), port):
        for request in (head + b"Expect: 100-continue\r\n\r\n", head + b'\r\n{"prompt": "' + b"x" * 5000):
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                sock.sendall(request)
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
            assert b'"error"' in answer and b"limit" in answer


def test_no_file_path_reaches_the_server(client):
    for url in ("/static/../../../etc/passwd", "/static/%2e%2e/%2e%2e/etc/passwd", "/api/run/figures/..%2Fx",
                "/api/run/figures/-1"):
        res = client.get(url)
        assert res.status_code == 404 and "root:" not in res.text
    assert client.get("/").status_code == 200
    for name in ("main.js", "grid.js", "explore.css"):
        assert client.get(f"/static/{name}").status_code == 200


def test_an_unexpected_failure_is_one_json_line(pre_sft, tiny_tok, monkeypatch):
    pre, sft = pre_sft
    explorer = Explorer({"pre": pre, "sft": sft}, tiny_tok)
    monkeypatch.setattr(explorer.passes, "logits", lambda *a: (_ for _ in ()).throw(RuntimeError("boom\nsecond line")))
    client = TestClient(create_app(explorer), base_url=SERVED, raise_server_exceptions=False)
    res = client.post("/api/graft", json={"prompt": PROMPT})
    assert res.status_code == 500 and res.json() == {"error": "internal error: RuntimeError: boom second line"}


def test_the_page_uses_no_network():
    from weightgraft.explore.app import STATIC

    for path in STATIC.iterdir():
        text = path.read_text()
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, path.name


def test_info_lays_out_every_slot(client, pre_sft):
    info = client.get("/api/info").json()
    assert info["roles"] == ["pre", "sft"] and info["slots"] == wg.slots(pre_sft[0])
    layout = info["layout"]
    placed = [s for g in layout["grids"] for layer in g["layers"] for s in layer] + [s for r in layout["rows"] for s in r["slots"]]
    assert sorted(placed) == list(range(len(info["slots"])))
    names = {s["name"] for s in info["schemes"]["position"]["sft2pre"]}
    assert {"FE", "LT", "FE+LT", "(FE+LT)^C", "FE^C", "LT^C"} <= names


def test_every_result_names_its_protocol_and_what_it_means(client):
    from weightgraft.schemes.protocol import PROTOCOLS

    meanings = client.get("/api/info").json()["schemes"]["protocols"]
    assert set(meanings) == set(PROTOCOLS) and all(len(m) > 20 and "\n" not in m for m in meanings.values())
    for protocol in PROTOCOLS:
        res = client.post("/api/graft", json={"prompt": PROMPT, "spans": SPANS, "protocol": protocol, "k": 2,
                                              "rules": [{"model": "sft", "positions": "first_entity+last"}]})
        assert res.status_code == 200 and res.json()["protocol"] == protocol


def test_hosts():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("example.org")


def test_serve_warns_off_loopback(capsys, monkeypatch):
    import uvicorn

    from weightgraft.explore.serve import serve

    monkeypatch.setattr(uvicorn.Server, "run", lambda self: None)
    serve(object(), host="0.0.0.0", port=9)
    err = capsys.readouterr().err
    assert "warning" in err and "not loopback" in err
    serve(object(), host="127.0.0.1", port=9)
    captured = capsys.readouterr()
    assert "warning" not in captured.err and "http://127.0.0.1:9/" in captured.out


def test_cli_refuses_missing_models_before_loading():
    from typer.testing import CliRunner

    from weightgraft.cli import app

    res = CliRunner().invoke(app, ["explore", "-m", "pre=smollm2-135m"])
    assert res.exit_code != 0 and "sft" in res.output
    res = CliRunner().invoke(app, ["explore", "-m", "pre=a", "-m", "sft=b", "--run", "/nonexistent/dir"])
    assert res.exit_code != 0 and "not a directory" in res.output


# ---------------------------------------------------------------- run and localize outputs

SLOW_FIXTURES = ("outputs",)  # its tests are `slow` (tests/conftest.py): a sweep and a localize run


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """A tiny position sweep and a tiny localize run (with report and search) on the tiny world."""
    from tiny_world import loader, tiny_config, write_world

    from weightgraft.api.localize import localize
    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.runner import run_experiment
    from weightgraft.localization.config import parse_localize_config
    from weightgraft.report import write_report

    root = tmp_path_factory.mktemp("explore_outputs")
    config = parse_config(tiny_config(root, "pos", world={"n": 3}))
    run_experiment(config, load=loader, progress=False)
    run_dir = next(p.parent for p in root.rglob("summary.csv"))
    write_report(run_dir)
    data = write_world(root / "locdata", n=3)
    loc = localize(parse_localize_config({
        "name": "loc", "data": str(data), "models": {"pre": "tiny-llama:pre", "sft": "tiny-llama:sft"},
        "out": str(root / "loc"), "batch_size": 3, "exact": 1, "graft_directions": ["sufficiency"],
        "claims": {"min_prompts": 2, "null_draws": 3, "resamples": 99}, "search": {"target_share": 0.8}, "templates": ["headline"]}), progress=False, load=loader)
    pre, sft = loader("tiny-llama:pre"), loader("tiny-llama:sft")
    return run_dir, loc.run_dir, pre, sft


def test_run_and_localize_outputs(outputs):
    from weightgraft.explore.artifacts import LocalizeView, RunView

    run_dir, loc_dir, pre, sft = outputs
    explorer = Explorer({"pre": pre.model, "sft": sft.model}, pre.tokenizer)
    client = TestClient(base_url=SERVED, app=create_app(explorer, RunView(run_dir), LocalizeView(loc_dir)))
    run = client.get("/api/run").json()
    assert run["rows"] and {r["scheme"] for r in run["rows"]} >= {"PRE", "SFT", "FE", "LT"}
    assert run["figures"], "the run's report figures are listed"
    fig = client.get(f"/api/run/figures/{run['figures'][0]['index']}")
    assert fig.status_code == 200 and fig.content[:4] == b"\x89PNG"
    assert client.get(f"/api/run/figures/{len(run['figures'])}").status_code == 404
    # a summary row opened in the grid: its scheme on its template's example, with the dataset's spans
    example = run["examples"]["headline"][0]
    assert example["spans"], "spans come from the run's dataset"
    scheme = run["schemes"]["FE"]
    res = client.post("/api/graft", json={"prompt": example["prompt"], "spans": example["spans"],
                                          "rules": scheme["rules"], "base": scheme["base"],
                                          "protocol": run["protocol"], "answer": example["answer"]})
    assert res.status_code == 200, res.text
    spans = {k: tuple(v) for k, v in example["spans"].items()}
    out = wg.graft({"pre": pre.model, "sft": sft.model}, pre.tokenizer, [example["prompt"]],
                   wg.Scheme.model_validate(scheme | {"name": "FE"}), spans=[spans], protocol=run["protocol"])
    _same_top(res.json()["top"]["graft"], out, 10)

    loc = client.get("/api/localize").json()
    assert loc["columns"][:1] == ["estimate"] and "exact" in loc["columns"]
    (m,) = loc["maps"]
    assert (m["direction"], m["template"]) == ("sufficiency", "headline")
    (search,) = loc["searches"]
    assert search["cells"] and search["size"] == len(search["cells"])
    # the found set, and the refinement and control sets where the run wrote them, as buttons
    import json

    raw = json.loads((loc_dir / "search.json").read_text())["searches"][0]
    names = [s["name"] for s in search["sets"]]
    assert names[0] == "minimal set" and search["sets"][0]["cells"] == search["cells"]
    if "controls" in raw:
        assert "random control #1" in names and "matched control #1" in names
        drawn = raw["controls"]["random"]["sets"][0]["cells"]
        shown = next(s for s in search["sets"] if s["name"] == "random control #1")["cells"]
        assert [[c["position_label"], c["slot"]] for c in shown] == drawn
    assert ("refined set" in names) == bool(raw.get("refined", {}).get("cells"))
    # the found set lands on an example through its position labels: every key on a token
    ex = loc["examples"]["headline"][0]
    toks = client.post("/api/tokens", json={"prompt": ex["prompt"], "spans": ex["spans"]}).json()["tokens"]
    labels = {t["label"] for t in toks}
    assert all(c["position_label"] in labels for s in search["sets"] for c in s["cells"])
    keys = {(label, slot) for label, slot, _ in m["values"]["estimate"]}
    assert {(c["position_label"], c["slot"]) for c in search["cells"]} <= keys
    # a set of whole cells applies as the same cells written as wg.graft rules
    assert search["sets"][0]["by_unit"] == {}
    cells = [{"position": t["position"], "slot": c["slot"], "model": "sft"}
             for c in search["cells"] for t in toks if t["label"] == c["position_label"]]
    res = client.post("/api/graft", json={"prompt": ex["prompt"], "spans": ex["spans"], "cells": cells})
    assert res.status_code == 200, res.text
    rules = [wg.Rule(model="sft", positions=str(c["position"]), components=c["slot"].split(".")[-1],
                     layers=c["slot"].split(".")[1] if c["slot"].startswith("layers.") else "all") for c in cells]
    _same_top(res.json()["top"]["graft"], wg.graft({"pre": pre.model, "sft": sft.model}, pre.tokenizer,
                                                   [ex["prompt"]], rules), 10)


def test_the_run_table_shows_every_metric_the_report_shows(outputs):
    """Each row of the report's summary tables (summary.md) is a row of the page's table, cell
    for cell, under the same headers; recovery is a number, not an empty column."""
    from weightgraft.explore.artifacts import RunView
    from weightgraft.report.tables import table_header
    TABLE_HEADER = table_header()

    run_dir = outputs[0]
    view = RunView(run_dir)
    assert view.columns[: view.columns.index("scheme")][:1] == ["template"]
    assert list(TABLE_HEADER) == view.columns[view.columns.index("scheme"):][: len(TABLE_HEADER)]
    page = {tuple(r["cells"][view.columns.index("scheme"):][: len(TABLE_HEADER)]) for r in view.rows}
    report_rows = [tuple(c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1])
                   for line in (run_dir / "report" / "summary.md").read_text().splitlines()
                   if line.startswith("| ") and not line.startswith("| scheme |")]
    report_rows = [r for r in report_rows if len(r) == len(TABLE_HEADER)]
    assert len(report_rows) == len(view.rows) and set(report_rows) == page
    recovery = view.columns.index("recovery (first token)")
    assert any(r["cells"][recovery][:1].isdigit() or r["cells"][recovery].startswith("-") for r in view.rows)
    whole = view.columns.index("recovery (whole answer)")  # the report's column, shown once
    assert view.columns.count("recovery (whole answer)") == 1
    assert any(r["cells"][whole] != "n/a" for r in view.rows)


def test_views_refuse_directories_of_the_wrong_kind(tmp_path):
    from weightgraft.explore.artifacts import LocalizeView, RunView

    with pytest.raises(ValueError, match="summary.csv"):
        RunView(tmp_path)
    with pytest.raises(ValueError, match="cells.parquet"):
        LocalizeView(tmp_path)
