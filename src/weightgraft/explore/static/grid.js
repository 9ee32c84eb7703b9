// The graft map: a position x layer grid per component group plus rows for embedding, final
// norm and unembedding. Click and drag paint the chosen role into every slot of a cell. A layer
// without the group (a hybrid's mixer layer has no q/k/v) is drawn empty and takes no paint.
// (a map's roles: the models, then the scaled roles its rules use)
const COLORS = ["var(--pre)", "var(--sft)", "var(--r2)", "var(--r3)", "#b07aa1", "#e15759", "#76b7b2", "#9c755f"];
export const roleColor = (i) => COLORS[i % COLORS.length];
// a token as the page shows it: leading spaces visible (" T" is not "T"), newlines as ⏎
export const shownToken = (t) => t.replace(/^ +/, (m) => "␣".repeat(m.length)).replace(/\n/g, "⏎");
const ROW_LABELS = { embed: "embed", final_norm: "norm", unembed: "unemb" };

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// Columns: a label column, then one per position. Rows top to bottom: last layer first.
function makeGrid(tokens, nRows, rowLabel) {
  const g = el("div", "grid");
  g.style.gridTemplateColumns = `3.2em repeat(${tokens.length}, var(--cell))`;
  const cells = [];
  for (let r = 0; r < nRows; r++) {
    g.appendChild(el("div", "ylab", rowLabel(r)));
    const row = [];
    for (let t = 0; t < tokens.length; t++) {
      const c = el("div", "c");
      c.dataset.row = r; c.dataset.t = t;
      g.appendChild(c); row.push(c);
    }
    cells.push(row);
  }
  g.appendChild(el("div", "ylab axis", "token →"));
  const longest = Math.max(1, ...tokens.map((t) => shownToken(t.token).length));
  const labelHeight = `${Math.min(8, 0.7 * longest + 0.6).toFixed(1)}em`;  // room for the longest token, no more
  for (const tok of tokens) {
    const x = el("div", "xlab", shownToken(tok.token));
    x.style.height = labelHeight;
    x.title = `${tok.position}: ${JSON.stringify(tok.token)} (${tok.label})`;
    g.appendChild(x);
  }
  return { g, cells };
}

// Draw every grid for these tokens; onPaint(slotIndices, position) is called per painted cell,
// onStroke() when a stroke ends. Returns {update(source), heat(valueOf)} to recolor.
export function drawGrids(root, layout, tokens, handlers) {
  root.replaceChildren();
  // long prompts get narrower cells, so the grids stay on a screen or two
  root.style.setProperty("--cell", tokens.length > 24 ? "10px" : "15px");
  root.style.setProperty("--row", tokens.length > 24 ? "8px" : "11px");
  const blocks = [];  // {cells, slotsAt(row) -> slot indices, heat cells}
  const L = layout.n_layers;
  for (const grid of layout.grids) {
    const block = el("div", "block");
    block.appendChild(el("h3", null, `${grid.title} (rows: layer, last at the top)`));
    const { g, cells } = makeGrid(tokens, L, (r) => String(L - 1 - r));
    block.appendChild(g);
    const heat = makeGrid(tokens, L, (r) => String(L - 1 - r));
    heat.g.classList.add("heat"); heat.g.hidden = true;
    block.appendChild(heat.g);
    root.appendChild(block);
    blocks.push({ cells, heat, slotsAt: (r) => grid.layers[L - 1 - r], key: grid.key });
  }
  const rowsBlock = el("div", "block rows");
  rowsBlock.appendChild(el("h3", null, "embedding · final norm · unembedding"));
  const rows = layout.rows;
  const { g, cells } = makeGrid(tokens, rows.length, (r) => ROW_LABELS[rows[r].key] || rows[r].key);
  rowsBlock.appendChild(g);
  const heat = makeGrid(tokens, rows.length, (r) => ROW_LABELS[rows[r].key] || rows[r].key);
  heat.g.classList.add("heat"); heat.g.hidden = true;
  rowsBlock.appendChild(heat.g);
  root.appendChild(rowsBlock);
  blocks.push({ cells, heat, slotsAt: (r) => rows[r].slots, key: "rows" });

  let painting = null;  // the role a stroke paints (or erases to)
  const paint = (block, cell) => {
    const slots = block.slotsAt(+cell.dataset.row);
    if (!slots.length) return;
    handlers.onPaint(slots, +cell.dataset.t, (current) => {
      if (painting === null) painting = current.every((r) => r === handlers.paintRole()) ? handlers.baseRole() : handlers.paintRole();
      return painting;
    }, block.key);
  };
  blocks.forEach((block) => {
    block.cells.flat().forEach((cell) => {
      cell.addEventListener("mousedown", (ev) => { ev.preventDefault(); painting = null; paint(block, cell); });
      cell.addEventListener("mouseenter", (ev) => { if (ev.buttons & 1 && painting !== null) paint(block, cell); });
    });
  });
  const end = () => { if (painting !== null) { painting = null; handlers.onStroke(); } };
  root.onmouseup = end; root.onmouseleave = end;

  // a cell some of whose heads or neurons come from another model: filled from the bottom by the
  // share of its units not from the base, data-units "grafted/all"
  const partialFill = (cell, slots, units, roles) => {
    const base = handlers.mapBase();
    let grafted = 0, all = 0, color = null;
    slots.forEach((s, i) => {
      const us = units[i] ? units[i].roles : Array(handlers.unitCount(s)).fill(roles[s]);
      us.forEach((x) => { all++; if (x !== base) { grafted++; color ??= x; } });
    });
    const pct = (100 * grafted / Math.max(all, 1)).toFixed(1);
    cell.dataset.units = `${grafted}/${all}`;
    cell.style.backgroundColor = roleColor(base);
    if (color !== null) cell.style.backgroundImage = `linear-gradient(to top, ${roleColor(color)} ${pct}%, transparent ${pct}%)`;
  };
  const unitsTitle = (name, u) => {
    const counts = new Map();
    u.roles.forEach((x) => counts.set(x, (counts.get(x) || 0) + 1));
    return `${name}: ` + [...counts.entries()].sort((a, b) => b[1] - a[1])
      .map(([x, c], i) => `${c}${i ? "" : ` of ${u.roles.length}`} ${u.kind}${c === 1 && i ? "" : "s"} from ${handlers.roleName(x)}`).join(", ");
  };

  return {
    blocks,
    update(source) {
      for (const block of blocks) {
        block.cells.forEach((row, r) => row.forEach((cell, t) => {
          const slots = block.slotsAt(r);
          cell.classList.toggle("absent", !slots.length);
          if (!slots.length) { cell.title = `layer ${L - 1 - r} has no ${block.key} slots`; return; }
          const roles = slots.map((s) => source[t][s]);
          const first = roles[0];
          const mixed = roles.some((x) => x !== first);
          const shown = mixed ? roles.find((x) => x !== handlers.baseRole()) : first;
          const units = slots.map((s) => handlers.unitsAt(s, t));
          cell.style.backgroundColor = roleColor(shown);
          cell.style.backgroundImage = "";
          cell.classList.toggle("mixed", mixed);
          cell.classList.toggle("partial", units.some(Boolean));
          delete cell.dataset.units;
          if (units.some(Boolean)) partialFill(cell, slots, units, source[t]);
          cell.title = `position ${t}, ${block.key} ${block.key === "rows" ? "" : "layer " + (L - 1 - r)}: ` +
            slots.map((s, i) => (units[i] ? unitsTitle(handlers.slotName(s), units[i]) : `${handlers.slotName(s)}=${handlers.roleName(source[t][s])}`)).join(" ");
        }));
      }
    },
    // valueOf(slot, position) -> number | null; null hides the heat maps
    heat(valueOf) {
      if (!valueOf) { blocks.forEach((block) => { block.heat.g.hidden = true; }); return; }
      let max = 0;
      const values = blocks.map((block) => block.heat.cells.map((row, r) => row.map((_, t) => {
        const vs = block.slotsAt(r).map((s) => valueOf(s, t)).filter((v) => v !== null && v !== undefined);
        const v = vs.length ? vs.reduce((a, b) => a + b, 0) : null;
        if (v !== null) max = Math.max(max, Math.abs(v));
        return v;
      })));
      blocks.forEach((block, b) => {
        block.heat.g.hidden = false;
        block.heat.cells.forEach((row, r) => row.forEach((cell, t) => {
          const v = values[b][r][t];
          const a = v === null || !max ? 0 : Math.abs(v) / max;
          cell.style.backgroundColor = v === null ? "#fff" : v >= 0 ? `rgba(200,30,30,${a})` : `rgba(30,80,200,${a})`;
          cell.title = v === null ? "" : `${v.toPrecision(3)}`;
        }));
      });
    },
  };
}
