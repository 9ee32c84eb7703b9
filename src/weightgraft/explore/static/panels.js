// The panels of a run (--run: summary table, figures) and of a localize run (--localize: cell
// map choice, minimal sets, examples). They call back into the page: open(...) applies a choice.
function el(tag, text, attrs = {}) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  Object.assign(e, attrs);
  return e;
}
const fmt = (v) => (typeof v === "number" && !Number.isInteger(v) ? v.toFixed(3) : v ?? "");

export function examplePicker(examples, onPick) {
  const wrap = el("div");
  const select = el("select");
  for (const [template, list] of Object.entries(examples || {})) {
    for (const [i, ex] of list.entries()) select.appendChild(el("option", `${template}: ${ex.prompt}`, { value: `${template}|${i}` }));
  }
  const button = el("button", "open example", { type: "button" });
  button.onclick = () => { const [t, i] = select.value.split("|"); onPick(examples[t][+i]); };
  wrap.append(el("span", "example ", { className: "caption" }), select, button);
  return select.options.length ? wrap : el("div");
}

export function drawRun(root, run, page) {
  root.hidden = false;
  root.replaceChildren(el("h2", `Run ${JSON.stringify(run.name)}, computed under protocol ${run.protocol}: a row click opens its scheme in the grid under that protocol`));
  const table = el("table", undefined, { className: "summary" });
  const head = el("tr");
  run.columns.forEach((c) => head.appendChild(el("th", c)));
  table.appendChild(head);
  for (const row of run.rows) {
    const tr = el("tr", undefined, { className: "row" });
    row.cells.forEach((c) => tr.appendChild(el("td", c)));
    tr.onclick = () => {
      const scheme = run.schemes[row.scheme];
      const example = (run.examples[row.template] || [])[0];
      if (!scheme) { page.error(`scheme ${row.scheme} is not in the run's manifest`); return; }
      page.openScheme(scheme, example, run.protocol);
    };
    table.appendChild(tr);
  }
  root.appendChild(table);
  root.appendChild(examplePicker(run.examples, (ex) => page.openExample(ex)));
  for (const fig of run.figures) {
    const f = el("figure");
    f.append(el("img", undefined, { src: `/api/run/figures/${fig.index}`, alt: fig.name, loading: "lazy" }), el("figcaption", fig.name));
    root.appendChild(f);
  }
}

export function drawLocalize(root, loc, page) {
  root.hidden = false;
  const which = loc.models && loc.models.length > 1 ? `, maps of ${loc.model}, the first of ${loc.models.length} SFT models` : "";
  root.replaceChildren(el("h2", `localize ${loc.name} (metric ${loc.metric}${which}): cell map drawn under each grid (red: raises the metric, blue: lowers it)`));
  const mapSel = el("select");
  loc.maps.forEach((m, i) => mapSel.appendChild(el("option", `${m.direction} / ${m.template} (${m.n_examples} prompts)`, { value: i })));
  const colSel = el("select");
  loc.columns.forEach((c) => colSel.appendChild(el("option", c, { value: c })));
  const show = el("input", undefined, { type: "checkbox", checked: true });
  const redraw = () => page.setHeat(show.checked ? loc.maps[+mapSel.value] : null, colSel.value);
  [mapSel, colSel, show].forEach((x) => { x.onchange = redraw; });
  const line = el("div");
  line.append(el("span", "map ", { className: "caption" }), mapSel, el("span", " value ", { className: "caption" }), colSel,
    el("label", " draw"), show);
  root.appendChild(line);
  const sets = el("div");
  for (const s of loc.searches) {
    for (const set of s.sets) {
      const share = set.share === null || set.share === undefined ? "" : `, share ${fmt(set.share)}`;
      const units = Object.entries(set.by_unit || {}).map(([kind, n]) => `${n} ${kind === "rest" ? "bias part" : kind}${n === 1 ? "" : "s"}`);
      const label = `${s.direction}/${s.template}: ${set.name}`;
      const b = el("button", `${label}, ${set.cells.length} cells${units.length ? ` (${units.join(", ")})` : ""}${share}`, { type: "button" });
      if (units.length) b.title = "heads and neurons are grafted unit by unit, the rest of their cells from the base";
      b.onclick = () => page.applySet(s.direction, set.cells, label);
      sets.appendChild(b);
    }
  }
  root.appendChild(sets);
  root.appendChild(examplePicker(loc.examples, (ex) => page.openExample(ex)));
  if (loc.maps.length) redraw();
}
