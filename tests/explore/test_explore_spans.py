"""Spans in ``weightgraft explore`` land on their own tokens: over the whole demo test set (the
demo's world and seed, SmolLM2's tokenizer), the spans the page sends select exactly the tokens
of the dataset's character offsets, through the page's own formatting (``static/tokens.js``,
run in Node where it exists) and the server. A text that occurs more than once is refused."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from starlette.testclient import TestClient
from tiny_models import make_tiny

from weightgraft.data import build_dataset
from weightgraft.data.spans import resolve_spans
from weightgraft.demo import DEMO_WORLD
from weightgraft.explore.app import STATIC, create_app
from weightgraft.explore.requests import RequestError, TokensRequest
from weightgraft.explore.session import Explorer
from weightgraft.schemes.selectors import token_span

DEMO_RELATIONS, DEMO_SEED = 40, 0  # run_demo's defaults
SERVED = "http://127.0.0.1:8765"


@pytest.fixture(scope="module")
def smollm_tok():
    from transformers import AutoTokenizer

    from weightgraft.models.embedded import embedded_cache_dir

    where = embedded_cache_dir("smollm2-135m")
    if not (where / "tokenizer.json").is_file():
        pytest.skip(f"SmolLM2's tokenizer is not converted here ({where}): run `weightgraft demo` once")
    return AutoTokenizer.from_pretrained(where)


@pytest.fixture(scope="module")
def demo_prompts(tmp_path_factory):
    """The demo's test prompts, built as the demo builds them, read back as a run's examples
    are (character offsets from the dataset file)."""
    from weightgraft.data.freeform import load_prompts

    out = tmp_path_factory.mktemp("demo_data")
    build_dataset(DEMO_WORLD, n=DEMO_RELATIONS, seed=DEMO_SEED, out=out)
    return [{"prompt": p.prompt, "spans": {k: list(v) for k, v in p.spans.items()}} for p in load_prompts(out)]


@pytest.fixture(scope="module")
def explorer(smollm_tok):
    model = make_tiny("llama", seed=0, vocab_size=len(smollm_tok), n_layers=2)
    return Explorer({"pre": model, "sft": model}, smollm_tok)


@pytest.fixture(scope="module")
def client(explorer):
    return TestClient(create_app(explorer), base_url=SERVED)


def _page_round_trip(examples: list[dict]) -> list[dict]:
    """What the page sends for each example: ``parseSpans(formatSpans(prompt, spans))``."""
    node = shutil.which("node")
    assert node is not None
    script = (f"import {{ formatSpans, parseSpans }} from {json.dumps((STATIC / 'tokens.js').as_uri())};"
              "let s = ''; process.stdin.on('data', (d) => { s += d; });"
              "process.stdin.on('end', () => { const xs = JSON.parse(s);"
              "process.stdout.write(JSON.stringify(xs.map((x) => parseSpans(formatSpans(x.prompt, x.spans))))); });")
    res = subprocess.run([node, "--input-type=module", "-e", script], input=json.dumps(examples),
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(res.stdout)


def _selected(explorer, prompt: str, spans: dict) -> dict[str, list[int]]:
    """Positions the server marks with each span (``POST /api/tokens`` without the HTTP)."""
    out: dict[str, list[int]] = {name: [] for name in spans}
    for t in explorer.tokens(TokensRequest(prompt=prompt, spans=spans)):
        for name in t["selectors"]:
            if name in out:
                out[name].append(t["position"])
    return out


def _own_tokens(tok, prompt: str, spans: dict) -> dict[str, list[int]]:
    offsets = tok(prompt, return_offsets_mapping=True)["offset_mapping"]
    return {name: token_span(offsets, s, e) for name, (s, e) in spans.items()}


@pytest.mark.slow
def test_every_demo_span_lands_on_its_own_tokens(explorer, smollm_tok, demo_prompts):
    """The dataset's offsets, and what the page makes of them (``formatSpans`` then
    ``parseSpans``), select each span's own tokens; the text of an ambiguous one is refused."""
    n_spans = sum(len(x["spans"]) for x in demo_prompts)
    assert (len(demo_prompts), n_spans) == (800, 3040)
    sent = _page_round_trip(demo_prompts) if shutil.which("node") else None
    ambiguous = as_offsets = 0
    for i, x in enumerate(demo_prompts):
        prompt, spans = x["prompt"], x["spans"]
        own = _own_tokens(smollm_tok, prompt, spans)
        assert all(own.values()), prompt
        assert _selected(explorer, prompt, spans) == own, prompt
        if sent is not None:
            # a text the page sends is the one place of those characters; the rest go as offsets
            # (the server resolves spans with resolve_spans: the same offsets, the same tokens)
            assert resolve_spans(prompt, sent[i]) == {k: tuple(v) for k, v in spans.items()}, prompt
            as_offsets += sum(isinstance(v, list) for v in sent[i].values())
        for name, (s, e) in spans.items():
            if prompt.count(prompt[s:e]) > 1:
                ambiguous += 1
                with pytest.raises(RequestError, match=rf"occurs \d+ times.*\({s}, {e}\)"):
                    explorer.tokens(TokensRequest(prompt=prompt, spans={name: prompt[s:e]}))
    # "in" of "Rory Culkin stars in in a movie alongside" and its kind (36 of them would land
    # elsewhere at their first occurrence)
    assert ambiguous >= 36
    if sent is None:
        pytest.skip("no node here to run the page's static/tokens.js (the server's half passed)")
    assert as_offsets == ambiguous


def test_spans_box_forms():
    """The spans box accepts ``name=(start,end)``; an edit of the prompt moves ranges with
    their text and names the ones it cut."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node here to run the page's static/tokens.js")
    script = (f"import {{ parseSpans, formatSpans, shiftSpans }} from {json.dumps((STATIC / 'tokens.js').as_uri())};"
              "const p = 'Rory Culkin stars in in a movie alongside';"
              "const parsed = parseSpans('first_actor=Rory Culkin; relation_preposition=( 18 , 20 )');"
              "const shown = formatSpans(p, {first_actor: [0, 11], relation_preposition: [18, 20]});"
              "const moved = shiftSpans(p, 'Yesterday, ' + p, {a: [0, 11], b: [18, 20], c: 'stars'});"
              "const inside = shiftSpans(p, p.replace('Culkin', 'C.'), {a: [0, 11], c: [18, 20]});"
              "const cut = shiftSpans(p, p.replace('kin st', 'XX'), {a: [0, 11], b: [12, 17], c: [18, 20]});"
              "console.log(JSON.stringify({parsed, shown, moved, inside, cut}));")
    res = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60, check=True)
    got = json.loads(res.stdout)
    assert got["parsed"] == {"first_actor": "Rory Culkin", "relation_preposition": [18, 20]}
    assert got["shown"] == "first_actor=Rory Culkin; relation_preposition=(18,20)"
    assert got["moved"] == {"spans": {"a": [11, 22], "b": [29, 31], "c": "stars"}, "dropped": []}
    assert got["inside"] == {"spans": {"a": [0, 7], "c": [14, 16]}, "dropped": []}  # "Rory C."
    # "kin st" -> "XX" cuts "Rory Culkin" at its end and "stars" at its start
    assert got["cut"] == {"spans": {"c": [14, 16]}, "dropped": ["a", "b"]}


@pytest.mark.parametrize("spans,match", [
    ({"actor": [True, 3]}, "spans.actor"),
    ({"actor": [0.0, 3.0]}, "spans.actor"),
    ({"actor": "in"}, "occurs 2 times"),
])
def test_spans_are_strict(client, spans, match):
    res = client.post("/api/tokens", json={"prompt": "Rory Culkin stars in a", "spans": spans})
    assert res.status_code == 400 and match in res.json()["error"], res.text
    assert "Value error" not in res.json()["error"]
