// Next-token top-k of PRE, SFT and the grafted pass side by side, and the answer's probability
// and rank under each.
const NAMES = { pre: "PRE", sft: "SFT", graft: "grafted" };
import { shownToken } from "./grid.js";

const shown = (t) => shownToken(JSON.stringify(t).slice(1, -1));

export function drawTop(root, top, answer) {
  root.replaceChildren();
  for (const key of ["pre", "sft", "graft"]) {
    const col = document.createElement("div");
    col.dataset.model = key;
    const h = document.createElement("h3"); h.textContent = NAMES[key]; col.appendChild(h);
    const max = Math.max(...top[key].map((e) => e.prob), 1e-9);
    for (const e of top[key]) {
      const row = document.createElement("div");
      row.className = "entry" + (answer && e.token_id === answer.token_id ? " answer" : "");
      const t = document.createElement("span"); t.className = "t"; t.textContent = shown(e.token);
      const bar = document.createElement("span"); bar.className = "bar"; bar.style.width = `${100 * e.prob / max}%`;
      const p = document.createElement("span"); p.className = "p"; p.textContent = (100 * e.prob).toFixed(1) + "%";
      row.append(t, bar, p); col.appendChild(row);
    }
    root.appendChild(col);
  }
}

export function drawAnswer(root, answer) {
  root.replaceChildren();
  if (!answer) return;
  const table = document.createElement("table");
  table.innerHTML = "<tr><th></th><th>PRE</th><th>SFT</th><th>grafted</th></tr>";
  for (const [label, key, fmt] of [["p(answer)", "prob", (v) => (100 * v).toFixed(2) + "%"], ["rank", "rank", (v) => v]]) {
    const tr = document.createElement("tr");
    const th = document.createElement("th"); th.textContent = label; tr.appendChild(th);
    for (const m of ["pre", "sft", "graft"]) {
      const td = document.createElement("td"); td.textContent = fmt(answer[key][m]); td.dataset.model = m; tr.appendChild(td);
    }
    table.appendChild(tr);
  }
  const cap = document.createElement("caption");
  cap.textContent = `answer ${JSON.stringify(answer.text)}: first token ${shownToken(answer.token)}`;
  table.prepend(cap);
  root.appendChild(table);
}
