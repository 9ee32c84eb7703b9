// The page: holds the graft map (source[position][slot] = role index into state.roles: the models,
// then the scaled roles the last map used), sends it to the server on every change, and draws
// what comes back. Applied rules (a scheme's) are sent as rules, each with its scale.
import { getJSON, postJSON } from "./api.js";
import { drawGrids, roleColor } from "./grid.js";
import { drawExperts } from "./experts.js";
import { drawLocalize, drawRun } from "./panels.js";
import { drawTokens, formatSpans, parseSpans, shiftSpans } from "./tokens.js";
import { drawAnswer, drawTop } from "./topk.js";
import { applyKey, clearUnits, mapCells, moveUnits, paintUnits, parseExperts, readUnits, unitSummary, unitsAt } from "./units.js";

const $ = (id) => document.getElementById(id);
// this page's name to the server: its strokes still waiting when a newer one comes are dropped
const PAGE = Math.random().toString(36).slice(2, 12);
const state = {
  info: null, roles: [], tokens: [], source: [], base: 0, paint: 1, rules: null, seq: 0, grids: null,
  heat: null, heatColumn: null, activeScheme: null, prompt: "", protocolBefore: null,
  units: {}, applied: null,  // heads / neurons grafted apart from their cell (units.js); the set applied
};

function showError(message) { $("error").textContent = message || ""; }
// what the page changed on its own (spans or paint moved, dropped): said, never silent
function notice(message) { $("notice").textContent = message || ""; }
function status(message) { $("status").textContent = message; }

function request() {
  const body = {
    prompt: $("prompt").value, answer: $("answer").value || null, k: +$("k").value || 8,
    protocol: $("protocol").value,
  };
  const spans = parseSpans($("spans").value);
  if (Object.keys(spans).length) body.spans = spans;
  return body;
}

function cells() {
  return mapCells(state.source, state.units, state.info.slots, state.roles, state.base);
}

async function graft() {
  const seq = ++state.seq;
  let body;
  try {
    body = request();
    Object.assign(body, state.rules ? { rules: state.rules, base: state.info.roles[state.base] } : cells(), { page: PAGE, seq });
  } catch (e) { showError(e.message); return; }
  status("grafting…");
  try {
    const res = await postJSON("/api/graft", body);
    if (seq !== state.seq) return;  // a newer change is on its way
    showError("");
    state.source = res.map.source;
    if (res.map.roles.join("\n") !== state.roles.join("\n")) { state.roles = res.map.roles; drawLegend(); }
    state.units = readUnits(res.map.units, state.info.slots);
    state.base = state.roles.indexOf(res.map.base);
    state.grids.update(state.source);
    drawTop($("top"), res.top, res.answer);
    drawAnswer($("answer-box"), res.answer);
    drawProtocol(res.protocol);
    drawGraftLine();
    status(`${res.tokens.length} tokens, ${res.ms} ms`);
    document.body.dataset.ready = String(seq);
  } catch (e) { if (seq === state.seq && e.status !== 409) { showError(e.message); status(""); } }
}

// tokens first (positions may move: painted cells follow their tokens), then the graft
async function refresh() {
  let res;
  try {
    const body = request();
    res = await postJSON("/api/tokens", {
      prompt: body.prompt, ...(body.spans ? { spans: body.spans } : {}),
      ...(state.tokens.length ? { previous: state.tokens.map((t) => t.token) } : {}),
    });
  } catch (e) { showError(e.message); return; }
  const same = res.tokens.length === state.tokens.length && res.tokens.every((t, i) => t.token_id === state.tokens[i].token_id && t.label === state.tokens[i].label);
  if (!same) {
    const S = state.info.slots.length;
    const painted = state.rules === null && state.tokens.length > 0;
    const origin = res.anchor ? res.anchor.origin : res.tokens.map(() => null);
    const old = state.source, oldUnits = state.units;
    state.source = res.tokens.map((_, t) => (painted && origin[t] !== null && old[origin[t]] ? [...old[origin[t]]] : Array(S).fill(state.base)));
    state.units = painted ? moveUnits(state.units, origin) : {};
    if (painted && res.anchor) reportAnchor(res.anchor, old, oldUnits);
  }
  state.tokens = res.tokens;
  drawTokens($("tokens"), state.tokens);
  if (!same) {
    state.grids = drawGrids($("grids"), state.info.layout, state.tokens, handlers);
    state.grids.update(state.source);
    drawHeat();
  }
  enableSchemes();
  await graft();
}

// say which painted tokens moved to another position and which paint found no token again
function reportAnchor(anchor, old, oldUnits) {
  const paintedAt = (p) => (old[p] && old[p].some((r) => r !== state.base)) || Object.values(oldUnits).some((u) => u.rows.has(p));
  const moved = anchor.moved.filter((m) => paintedAt(m.from));
  const dropped = anchor.dropped.filter((d) => paintedAt(d.from));
  const q = (t) => JSON.stringify(t);
  const parts = [];
  if (moved.length) parts.push(`paint kept on its token${moved.length > 1 ? "s" : ""}: ` + moved.map((m) => `${q(m.token)} ${m.from}→${m.to}`).join(", "));
  if (dropped.length) parts.push(`paint dropped (its token is gone): ` + dropped.map((d) => `${q(d.token)} at ${d.from}`).join(", "));
  notice(parts.join("; "));
}

const handlers = {
  paintRole: () => state.paint,
  baseRole: () => (state.paint !== state.base ? state.base : state.paint === 0 ? 1 : 0),
  roleName: (i) => state.roles[i],
  slotName: (s) => state.info.slots[s],
  mapBase: () => state.base,
  unitsAt: (s, t) => unitsAt(state.units, s, t),
  unitCount: (s) => state.info.units[s]?.n || 1,
  onPaint(slots, t, choose, key) {
    const which = key === "experts" ? pickedExperts() : null;  // single experts of the bank, or the whole cell
    if (which === undefined) return;
    if (which) paintUnits(state, slots, t, which, choose);
    else {
      const role = choose(slots.map((s) => state.source[t][s]));
      slots.forEach((s) => { state.source[t][s] = role; });
      clearUnits(state.units, slots, t);
    }
    state.applied = null;
    setRules(null);
    markScheme(null);
    state.grids.update(state.source);
  },
  onStroke() { graft(); },
};

// the experts field: null (the whole bank), the indices, or undefined after saying why not
function pickedExperts() {
  const bank = state.info.units.find((u) => u && u.kind === "expert");
  try { showError(""); return parseExperts($("experts-list").value, bank ? bank.n : 0); } catch (e) { showError(e.message); return undefined; }
}

function drawHeat() {
  if (!state.grids) return;
  if (!state.heat) { state.grids.heat(null); return; }
  const values = new Map((state.heat.values[state.heatColumn] || []).map(([label, slot, v]) => [`${label}|${slot}`, v]));
  state.grids.heat((s, t) => values.get(`${state.tokens[t].label}|${state.info.slots[s]}`) ?? null);
}

function markScheme(button) {
  document.querySelectorAll("button.scheme").forEach((b) => b.classList.toggle("on", b === button));
}

// the rules sent (copies: a rule's scale is set on the page's own) and their scale inputs
function setRules(rules) {
  state.rules = rules && rules.map((r) => ({ ...r }));
  drawRules();
}

const graftSoon = debounce(graft, 250);
const ruleText = (r) => `${r.model}: ${r.positions || "all"} · ${r.components || "body"} · layers ${r.layers || "all"}` +
  (r.heads ? ` · heads ${r.heads}` : "") + (r.experts ? ` · experts ${r.experts}` : "");

// one numeric input per applied rule: its cells hold base + scale × (model − base)
function drawRules() {
  const root = $("rules");
  const rules = state.rules || [];
  root.hidden = !rules.length;
  root.replaceChildren();
  if (!rules.length) return;
  const caption = document.createElement("span");
  caption.className = "caption"; caption.textContent = "rules, scale ×";
  caption.title = "a rule's cells hold base + scale × (model − base): 0 the base, 1 the graft, 2 doubles the finetune's change, -1 reverses it";
  root.appendChild(caption);
  rules.forEach((rule, i) => {
    const label = document.createElement("label");
    label.className = "rule";
    const input = document.createElement("input");
    input.type = "number"; input.step = "0.5"; input.className = "scale"; input.value = String(rule.scale ?? 1);
    input.title = `scale of rule ${i + 1} (1: the plain graft)`;
    input.addEventListener("input", () => {
      const v = input.value.trim() === "" ? NaN : Number(input.value);
      if (!Number.isFinite(v)) { showError(`rule ${i + 1}: the scale must be a number`); return; }
      if (v === 1) delete rule.scale; else rule.scale = v;
      graftSoon();
    });
    label.append(ruleText(rule), input);
    root.appendChild(label);
  });
}

function applyScheme(scheme, button) {
  setRules(scheme.rules);
  state.applied = null;
  state.base = state.info.roles.indexOf(scheme.base);
  if (state.base < 0) { showError(`scheme ${scheme.name} uses base ${scheme.base}, which is not loaded`); return; }
  markScheme(button || null);
  graft();
}

function enableSchemes() {
  const have = new Set(state.tokens.flatMap((t) => t.selectors));
  document.querySelectorAll("button.scheme").forEach((b) => {
    const needs = JSON.parse(b.dataset.needs || "[]");
    const missing = needs.filter((n) => !have.has(n));
    b.disabled = missing.length > 0;
    b.title = missing.length ? `mark span(s) ${missing.join(", ")} in the spans box` : b.dataset.rules;
  });
}

function drawSchemes() {
  const dir = $("direction").value;
  const root = $("position-schemes");
  root.replaceChildren();
  for (const scheme of state.info.schemes.position[dir]) {
    const b = document.createElement("button");
    b.type = "button"; b.className = "scheme"; b.textContent = scheme.name;
    b.dataset.needs = JSON.stringify(scheme.needs); b.dataset.rules = JSON.stringify(scheme.rules);
    b.onclick = () => applyScheme(scheme, b);
    root.appendChild(b);
  }
  enableSchemes();
}

// what the grid's colours mean: a colour per model, stripes where a cell's slots differ
function drawLegend() {
  const root = $("legend");
  root.replaceChildren("cells:");
  state.roles.forEach((role, i) => {
    const item = document.createElement("span");
    const sw = document.createElement("span"); sw.className = "swatch"; sw.style.background = roleColor(i);
    item.append(sw, `from ${role}`);
    root.appendChild(item);
  });
  const mixed = document.createElement("span");
  const sw = document.createElement("span"); sw.className = "swatch mixed"; sw.style.backgroundColor = roleColor(1);
  mixed.append(sw, "some slots of the cell from another model");
  root.appendChild(mixed);
  const partial = document.createElement("span");
  const psw = document.createElement("span"); psw.className = "swatch partial";
  partial.append(psw, "some heads, neurons or experts from another model (filled by their share; hover for counts)");
  root.appendChild(partial);
}

function drawPalette() {
  const root = $("palette");
  root.replaceChildren();
  state.info.roles.forEach((role, i) => {
    const b = document.createElement("button");
    b.type = "button"; b.className = "role" + (i === state.paint ? " on" : ""); b.textContent = role;
    b.style.background = roleColor(i); b.dataset.role = role;
    b.onclick = () => { state.paint = i; drawPalette(); };
    root.appendChild(b);
  });
}

// character ranges in the spans box follow an edit of the prompt (text spans are found again)
function moveSpans() {
  const before = state.prompt, after = $("prompt").value;
  state.prompt = after;
  let spans;
  try { spans = parseSpans($("spans").value); } catch (e) { return; }
  if (!Object.values(spans).some(Array.isArray)) return;
  const { spans: kept, dropped } = shiftSpans(before, after, spans);
  $("spans").value = formatSpans(after, kept);
  if (dropped.length) notice(`the edit cut through span(s) ${dropped.join(", ")}: removed from the spans box, mark them again`);
}

// the protocol the shown numbers were computed under, what it means, and (after a run row
// switched it) the way back to the one chosen before
function drawProtocol(protocol) {
  const line = $("protocol-line");
  line.replaceChildren();
  const b = document.createElement("b"); b.textContent = `protocol ${protocol}`;
  line.append(b, `: ${state.info.schemes.protocols[protocol] || ""}`);
  const back = state.protocolBefore;
  line.classList.toggle("switched", back !== null && back !== protocol);
  if (back !== null && back !== protocol) {
    const button = document.createElement("button");
    button.type = "button"; button.textContent = `back to ${back}`;
    button.onclick = () => { $("protocol").value = back; state.protocolBefore = null; graft(); };
    line.append(" (switched by the run row: the run was computed so) ", button);
  }
}

const page = {
  error: showError,
  openExample(ex) {
    $("prompt").value = ex.prompt;
    state.prompt = ex.prompt;
    $("spans").value = formatSpans(ex.prompt, ex.spans);
    $("answer").value = ex.answer || "";
    refresh();
  },
  openScheme(scheme, ex, protocol) {
    const wanted = protocol || "paper";
    if (wanted !== $("protocol").value && state.protocolBefore === null) state.protocolBefore = $("protocol").value;
    $("protocol").value = wanted;
    setRules(scheme.rules);
    state.applied = null;
    state.base = Math.max(0, state.info.roles.indexOf(scheme.base));
    markScheme(null);
    if (ex) page.openExample(ex); else graft();
  },
  setHeat(map, column) { state.heat = map; state.heatColumn = column; drawHeat(); },
  // an expert map's click: its rule (that expert, layer and region) over PRE
  applyRules(rules, name) {
    setRules(rules);
    state.base = state.info.roles.indexOf("pre");
    state.applied = null;
    markScheme(null);
    notice(name);
    graft();
  },
  // a localize run's set: whole cells painted, heads and neurons (layers.3.o/h2) unit by unit
  applySet(direction, keyed, name) {
    const pre = state.info.roles.indexOf("pre"), sft = state.info.roles.indexOf("sft");
    const [base, role] = direction === "necessity" ? [sft, pre] : [pre, sft];
    const S = state.info.slots.length;
    state.source = state.tokens.map(() => Array(S).fill(base));
    state.units = {};
    state.base = base;
    let found = 0;
    for (const { position_label: label, slot } of keyed) {
      const ts = state.tokens.filter((t) => t.label === label).map((t) => t.position);
      if (ts.map((t) => applyKey(state, slot, t, role)).some(Boolean)) found++;
    }
    state.applied = name;
    setRules(null);
    markScheme(null);
    state.grids.update(state.source);
    graft().then(() => { if (found < keyed.length) showError(`${keyed.length - found} of ${keyed.length} cells have no position labelled so on this prompt (mark its spans as the localize run did)`); });
  },
};

// what the grafted column shows, beside the protocol: the set applied (by unit or as whole
// cells), and how many heads and neurons are grafted apart from their cells
function drawGraftLine() {
  const units = unitSummary(state.units, state.base);
  const byUnit = units ? `by unit: ${units} from another model than ${state.roles[state.base]}` : "";
  $("graft-line").textContent = state.applied
    ? `set ${state.applied}, applied ${byUnit || "as whole cells"}`
    : byUnit && `grafted ${byUnit}`;
}

// the example the server chose to open on (a fact the finetune knows, where one is known) and where it came from
function openOn(opening) {
  if (!opening) return;
  $("prompt").value = opening.prompt;
  $("spans").value = formatSpans(opening.prompt, opening.spans);
  $("answer").value = opening.answer || "";
  $("opening").textContent = opening.line;
  $("opening").classList.toggle("unchecked", !opening.checked);
}

function debounce(fn, ms) { let t; return () => { clearTimeout(t); t = setTimeout(fn, ms); }; }

async function init() {
  try { state.info = await getJSON("/api/info"); } catch (e) { showError(e.message); return; }
  state.roles = state.info.roles;
  $("models").textContent = `models: ${state.info.roles.join(", ")}; ${state.info.layout.n_layers} layers, ${state.info.slots.length} slots per position`;
  $("prompt").maxLength = state.info.limits.max_prompt_chars;
  $("k").max = state.info.limits.max_k;
  drawPalette();
  drawLegend();
  drawSchemes();
  $("direction").onchange = drawSchemes;
  for (const name of state.info.schemes.component_sets) $("component-set").appendChild(new Option(name));
  for (const name of state.info.schemes.layer_groups) $("layer-group").appendChild(new Option(name, name, false, name === "last_quarter"));
  $("apply-component").onclick = () => {
    const name = `${$("component-set").value}@${$("layer-group").value}`;
    const scheme = state.info.schemes.component[$("direction").value].find((s) => s.name === name);
    if (scheme) applyScheme(scheme);
  };
  $("reset").onclick = () => { setRules([]); state.applied = null; markScheme(null); graft(); };
  const later = debounce(refresh, 250);
  openOn(state.info.opening);
  state.prompt = $("prompt").value;
  $("prompt").addEventListener("input", () => { moveSpans(); later(); });
  $("spans").addEventListener("input", later);
  ["answer", "k"].forEach((id) => $(id).addEventListener("input", debounce(graft, 250)));
  $("protocol").onchange = () => { state.protocolBefore = null; graft(); };
  if (state.info.run) {
    try { drawRun($("run"), await getJSON("/api/run"), page); } catch (e) { showError(e.message); }
  }
  $("experts-pick").hidden = !state.info.units.some((u) => u && u.kind === "expert");
  if (state.info.experts) {
    try { drawExperts($("experts"), await getJSON("/api/experts"), page, state.info.roles); } catch (e) { showError(e.message); }
  }
  if (state.info.localize) {
    try { drawLocalize($("localize"), await getJSON("/api/localize"), page); } catch (e) { showError(e.message); }
  }
  await refresh();
}

init();
