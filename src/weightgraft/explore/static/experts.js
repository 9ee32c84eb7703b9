// An expert map (--experts: `weightgraft experts`' folder) beside the grids: per region, a
// layer x expert table of one model's mean exact effect (colour, with its interval in the
// tooltip) and pick rate (dot). A click grafts that expert of that layer at the region's tokens
// from that model into PRE, as a rule the grid then shows (wg.Rule with experts).
import { examplePicker } from "./panels.js";

function el(tag, text, attrs = {}) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  Object.assign(e, attrs);
  return e;
}
const num = (v) => (v === null || v === undefined ? "–" : Math.abs(v) >= 100 || (v !== 0 && Math.abs(v) < 0.001) ? v.toExponential(1) : v.toFixed(3));

// the tooltip: what the cell is, in words and numbers
function describe(map, model, region, c) {
  const level = Math.round(100 * map.level);
  const interval = c.ci_low === null ? `interval declined${c.declined ? `: ${c.declined}` : ""}` : `${level}% interval [${num(c.ci_low)}, ${num(c.ci_high)}]`;
  const picked = c.pick_rate > 0 ? `picked at ${(100 * c.pick_rate).toFixed(0)}% of the region's tokens` : "never picked there: an exact 0";
  return `layer ${c.layer}, expert ${c.expert} at ${region}: mean ${map.metric} effect ${num(c.effect)} (${interval}; ${c.n_prompts} prompts); ${picked}`;
}

function table(map, model, template, region, roles, page) {
  const cols = map.columns;
  const rows = (map.cells[model]?.[template]?.[region] || []).map((r) => Object.fromEntries(cols.map((c, i) => [c, r[i]])));
  const max = Math.max(1e-12, ...rows.map((c) => Math.abs(c.effect ?? 0)));
  const t = el("table", undefined, { className: "emap" });
  t.appendChild(el("caption", `${region} (rows: layer, last at the top)`));
  const head = el("tr");
  head.appendChild(el("th", "layer"));
  for (let e = 0; e < map.n_experts; e++) head.appendChild(el("th", `e${e}`));
  t.appendChild(head);
  const can = roles.includes(model) && roles.includes("pre");
  for (const layer of [...map.layers].reverse()) {
    const tr = el("tr");
    tr.appendChild(el("th", String(layer)));
    for (let e = 0; e < map.n_experts; e++) {
      const c = rows.find((x) => x.layer === layer && x.expert === e);
      const td = el("td", undefined, { className: "v" });
      if (c) {
        const a = Math.min(1, Math.abs(c.effect ?? 0) / max);
        td.style.backgroundColor = (c.effect ?? 0) >= 0 ? `rgba(200,30,30,${a})` : `rgba(30,80,200,${a})`;
        const size = c.pick_rate > 0 ? 3 + 7 * c.pick_rate : 0;  // never picked: no dot (an exact 0)
        td.append(el("span", undefined, { className: "dot", style: `width:${size}px;height:${size}px` }), num(c.effect));
        td.classList.toggle("sig", c.ci_low !== null && (c.ci_low > 0 || c.ci_high < 0));
        td.title = describe(map, model, region, c) + (can ? `. Click: graft it from ${model} into PRE at ${region} on this prompt.` : `. No model named ${model} is loaded here (-m ${model}=...).`);
        td.classList.toggle("off", !can);
        if (can) {
          td.onclick = () => page.applyRules(
            [{ model, positions: region, layers: String(layer), components: "experts", experts: String(e) }],
            `expert map: expert ${e} of layer ${layer} from ${model} at ${region} (all its tokens at once; the map's value is a mean over prompts of single-token grafts)`);
        }
      }
      tr.appendChild(td);
    }
    t.appendChild(tr);
  }
  return t;
}

export function drawExperts(root, map, page, roles) {
  root.hidden = false;
  const prompts = Object.entries(map.n_prompts).map(([t, n]) => `${t}: ${n}`).join(", ");
  root.replaceChildren(el("h2", `expert map ${map.name} (metric ${map.metric}; sufficiency: one expert of the model into PRE; prompts ${prompts})`));
  root.appendChild(el("div", map.meaning, { className: "meaning" }));
  const sources = Object.entries(map.sources).map(([m, s]) => `${m}=${s}${map.weights[m] ? ` (${map.weights[m]})` : ""}`).join(", ");
  root.appendChild(el("div", `computed on ${sources}`, { className: "meaning" }));
  const modelSel = el("select");
  map.models.forEach((m) => modelSel.appendChild(el("option", m, { value: m })));
  const templateSel = el("select");
  map.templates.forEach((t) => templateSel.appendChild(el("option", t, { value: t })));
  const tables = el("div");
  const redraw = () => tables.replaceChildren(...map.regions.map((r) => table(map, modelSel.value, templateSel.value, r, roles, page)));
  [modelSel, templateSel].forEach((x) => { x.onchange = redraw; });
  const line = el("div");
  line.append(el("span", "model ", { className: "caption" }), modelSel, el("span", " template ", { className: "caption" }), templateSel,
    el("span", " (red: raises the metric, blue: lowers it; bold: its interval excludes 0; dot: pick rate)", { className: "caption" }));
  root.append(line, tables, examplePicker(map.examples, (ex) => page.openExample(ex)));
  redraw();
}
