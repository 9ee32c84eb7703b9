import { shownToken } from "./grid.js";

// The token strip: each token with its position, its position label, and the spans it is in.
export function drawTokens(root, tokens) {
  root.replaceChildren();
  for (const tok of tokens) {
    const box = document.createElement("span");
    box.className = "tok" + (tok.selectors.some((s) => s !== "last") ? " span" : "");
    box.title = `selected by: ${tok.selectors.join(", ") || "(no named span)"}; characters ${tok.start}-${tok.end}`;
    const pos = document.createElement("span"); pos.className = "pos"; pos.textContent = tok.position;
    const text = document.createElement("span"); text.className = "text"; text.textContent = shownToken(tok.token);
    const label = document.createElement("span"); label.className = "label"; label.textContent = tok.label;
    box.append(pos, text, label);
    root.appendChild(box);
  }
}

const OFFSETS = /^\(\s*(\d+)\s*,\s*(\d+)\s*\)$/;

// Starts of `text` in `prompt`, overlapping ones included.
export function occurrences(prompt, text) {
  const out = [];
  for (let i = prompt.indexOf(text); i >= 0 && text; i = prompt.indexOf(text, i + 1)) out.push(i);
  return out;
}

// "name=substring; other=(start,end)" -> {name: substring, other: [start, end]}. The server
// refuses a substring that occurs more than once; (start,end) names one place exactly.
export function parseSpans(text) {
  const spans = {};
  for (const part of text.split(";")) {
    if (!part.trim()) continue;
    const i = part.indexOf("=");
    if (i < 1) throw new Error(`span ${JSON.stringify(part.trim())} must look like name=substring or name=(start,end)`);
    const value = part.slice(i + 1).trim();
    const m = OFFSETS.exec(value);
    spans[part.slice(0, i).trim()] = m ? [+m[1], +m[2]] : value;
  }
  return spans;
}

// {name: [start, end] | substring} of a prompt -> the spans box's text: the substring where it
// occurs once in the prompt (readable, and found again exactly), else "(start,end)".
export function formatSpans(prompt, spans) {
  return Object.entries(spans || {}).map(([k, v]) => {
    if (!Array.isArray(v)) return `${k}=${v}`;
    const text = prompt.slice(v[0], v[1]);
    const unique = text.trim() === text && !text.includes(";") && !OFFSETS.test(text) && occurrences(prompt, text).length === 1;
    return unique ? `${k}=${text}` : `${k}=(${v[0]},${v[1]})`;
  }).join("; ");
}

// After an edit of the prompt (one changed stretch, as typing makes), character ranges move with
// their text: a range after the edit shifts, one holding the whole edit stretches; a range the
// edit cuts through cannot be kept and is returned in `dropped`. Substrings are left as they are.
export function shiftSpans(before, after, spans) {
  let head = 0;
  while (head < before.length && head < after.length && before[head] === after[head]) head++;
  let tail = 0;
  while (tail < before.length - head && tail < after.length - head &&
         before[before.length - 1 - tail] === after[after.length - 1 - tail]) tail++;
  const cutEnd = before.length - tail, delta = after.length - before.length;  // [head, cutEnd) was replaced
  const kept = {}, dropped = [];
  for (const [k, v] of Object.entries(spans)) {
    if (!Array.isArray(v) || before === after) { kept[k] = v; continue; }
    const [s, e] = v;
    if (e <= head) kept[k] = [s, e];
    else if (s >= cutEnd) kept[k] = [s + delta, e + delta];
    else if (s <= head && e >= cutEnd && e + delta > s) kept[k] = [s, e + delta];
    else dropped.push(k);
  }
  return { spans: kept, dropped };
}
