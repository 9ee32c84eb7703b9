// Heads, neurons and a mixture of experts' experts grafted apart from their cell (a localize run's
// found set of units, a per-head rule, experts painted one by one or an expert map's click). The
// page keeps, per slot index, the positions whose units differ from the cell
// ({kind, n, rows: Map(position -> role per unit)}), sends them back as unit cells
// (layers.3.o/h2, layers.3.up/n17, layers.3.experts/e5, layers.3.down/bias: the names localize
// writes) and says how many units are grafted. A bank has no part outside its experts: no /bias.

const LETTER = { head: "h", neuron: "n", expert: "e" };

// the server's map.units (slot name -> {kind, n, rows: [[position, roles]]}) by slot index
export function readUnits(mapUnits, slots) {
  const out = {};
  for (const [name, u] of Object.entries(mapUnits || {})) {
    out[slots.indexOf(name)] = { kind: u.kind, n: u.n, rows: new Map(u.rows.map(([t, roles]) => [t, roles])) };
  }
  return out;
}

const mostCommon = (roles) => {
  const counts = new Map();
  roles.forEach((r) => counts.set(r, (counts.get(r) || 0) + 1));
  return [...counts.entries()].sort((a, b) => b[1] - a[1] || a[0] - b[0])[0][0];
};

// the map as a request's explicit cells over its most common role (the smallest message): whole
// cells, then the unit rows (unitCells); the server builds the same map from them
export function mapCells(source, units, slots, roles, fallback) {
  const counts = new Map();
  source.forEach((row) => row.forEach((r) => counts.set(r, (counts.get(r) || 0) + 1)));
  const base = [...counts.entries()].sort((a, b) => b[1] - a[1])[0]?.[0] ?? fallback;
  const out = [];
  source.forEach((row, t) => row.forEach((r, s) => {
    if (r !== base && !unitsAt(units, s, t)) out.push({ position: t, slot: slots[s], model: roles[r] });
  }));
  out.push(...unitCells(units, source, slots, roles, base));
  return { base: roles[base], cells: out };
}

// the cells that spell out one unit row over `base`: the row's most common role as the whole
// cell, then the units that differ from it, then the slot's own part where its cell differs
export function unitCells(units, source, slots, roles, base) {
  const out = [];
  for (const [s, u] of Object.entries(units)) {
    for (const [t, row] of u.rows) {
      const common = mostCommon(row), name = slots[s];
      if (common !== base) out.push({ position: t, slot: name, model: roles[common] });
      row.forEach((r, k) => { if (r !== common) out.push({ position: t, slot: `${name}/${LETTER[u.kind]}${k}`, model: roles[r] }); });
      if (u.kind !== "expert" && source[t][s] !== common) out.push({ position: t, slot: `${name}/bias`, model: roles[source[t][s]] });
    }
  }
  return out;
}

// a found set's key (layers.3.o/h2, layers.3.up/n17, layers.3.down/bias or a whole slot) put
// on the map at position t with `role`; false where the model has no such slot or unit
export function applyKey(state, key, t, role) {
  const [name, unit] = key.split("/");
  const s = state.info.slots.indexOf(name);
  if (s < 0) return false;
  if (unit === undefined) { state.source[t][s] = role; rowsOf(state, s, false)?.rows.delete(t); return true; }
  const u = rowsOf(state, s, true);
  if (!u) return false;
  if (!u.rows.has(t)) u.rows.set(t, Array(u.n).fill(state.source[t][s]));
  if (unit === "bias") { state.source[t][s] = role; return true; }
  const k = +unit.slice(1);
  if (unit[0] !== LETTER[u.kind] || !Number.isInteger(k) || k < 0 || k >= u.n) return false;
  u.rows.get(t)[k] = role;
  return true;
}

function rowsOf(state, s, make) {
  const kind = state.info.units[s];
  if (!kind) return null;
  if (!state.units[s] && make) state.units[s] = { kind: kind.kind, n: kind.n, rows: new Map() };
  return state.units[s] || null;
}

// "2", "0,3", "0..3" or "all" (null: the whole bank) as expert indices below n; throws one line
export function parseExperts(text, n) {
  const t = text.trim();
  if (t === "" || t === "all") return null;
  const out = new Set();
  for (const part of t.split(",")) {
    const m = part.trim().match(/^(\d+)(?:\.\.(\d+))?$/);
    if (!m) throw new Error(`experts: ${JSON.stringify(part.trim())} is not an expert index or a range a..b`);
    const [a, b] = [+m[1], m[2] === undefined ? +m[1] : +m[2]];
    if (a > b || b >= n) throw new Error(`experts: the banks have ${n} experts (0..${n - 1}); no ${part.trim()}`);
    for (let k = a; k <= b; k++) out.add(k);
  }
  return [...out].sort((x, y) => x - y);
}

// paint experts `which` of the banks `slots` at position t: choose(current roles) -> the role
export function paintUnits(state, slots, t, which, choose) {
  const rows = slots.map((s) => {
    const u = rowsOf(state, s, true);
    if (!u.rows.has(t)) u.rows.set(t, Array(u.n).fill(state.source[t][s]));
    return u.rows.get(t);
  });
  const role = choose(rows.flatMap((row) => which.map((k) => row[k])));
  rows.forEach((row) => which.forEach((k) => { row[k] = role; }));
}

// a painted whole cell replaces the units painted apart at (t, s)
export function clearUnits(units, slotsPainted, t) {
  slotsPainted.forEach((s) => units[s]?.rows.delete(t));
}

// unit rows follow their tokens after an edit (origin[newT] = old position or null)
export function moveUnits(units, origin) {
  const out = {};
  for (const [s, u] of Object.entries(units)) {
    const rows = new Map();
    origin.forEach((old, t) => { if (old !== null && u.rows.has(old)) rows.set(t, [...u.rows.get(old)]); });
    out[s] = { ...u, rows };
  }
  return out;
}

// the units of slot s at position t as a cell's tooltip and fill: "layers.3.o: 3 of 4 heads from sft"
export function unitsAt(units, s, t) {
  const u = units[s];
  return u && u.rows.has(t) ? { kind: u.kind, roles: u.rows.get(t) } : null;
}

// how many units are grafted apart from their cells, not from the base: "1 of 4 heads in 1 cell"
export function unitSummary(units, base) {
  const per = {};
  for (const u of Object.values(units)) {
    for (const row of u.rows.values()) {
      const p = (per[u.kind] ||= { grafted: 0, of: 0, cells: 0 });
      p.grafted += row.filter((r) => r !== base).length; p.of += row.length; p.cells += 1;
    }
  }
  return Object.entries(per).map(([kind, p]) => `${p.grafted} of ${p.of} ${kind}s in ${p.cells} cell${p.cells === 1 ? "" : "s"}`).join(", ");
}
