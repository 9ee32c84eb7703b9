// The token strip: each token with its position, its position label, and the spans it is in.
export function drawTokens(root, tokens) {
  root.replaceChildren();
  for (const tok of tokens) {
    const box = document.createElement("span");
    box.className = "tok" + (tok.selectors.some((s) => s !== "last") ? " span" : "");
    box.title = `selected by: ${tok.selectors.join(", ") || "(no named span)"}; characters ${tok.start}-${tok.end}`;
    const pos = document.createElement("span"); pos.className = "pos"; pos.textContent = tok.position;
    const text = document.createElement("span"); text.className = "text"; text.textContent = tok.token.replace(/\n/g, "⏎");
    const label = document.createElement("span"); label.className = "label"; label.textContent = tok.label;
    box.append(pos, text, label);
    root.appendChild(box);
  }
}

// "name=substring; other=substring" -> {name: substring}
export function parseSpans(text) {
  const spans = {};
  for (const part of text.split(";")) {
    if (!part.trim()) continue;
    const i = part.indexOf("=");
    if (i < 1) throw new Error(`span ${JSON.stringify(part.trim())} must look like name=substring`);
    spans[part.slice(0, i).trim()] = part.slice(i + 1).trim();
  }
  return spans;
}

// {name: [start, end] | substring} of a prompt -> "name=substring; ..."
export function formatSpans(prompt, spans) {
  return Object.entries(spans || {})
    .map(([k, v]) => `${k}=${Array.isArray(v) ? prompt.slice(v[0], v[1]) : v}`).join("; ");
}
