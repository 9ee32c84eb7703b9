// HTTP calls to the explore server: JSON in, JSON out; a refusal throws its one-line reason, and
// a server that does not answer says so (not the browser's "Failed to fetch").
const GONE = "the explore server does not answer: is `weightgraft explore` still running?";

async function call(url, options) {
  let res;
  try { res = await fetch(url, options); } catch (e) { throw new Error(GONE); }
  let body;
  try { body = await res.json(); } catch (e) { throw new Error(`${url}: HTTP ${res.status}, not a JSON answer`); }
  if (!res.ok) throw Object.assign(new Error(body.error || res.statusText), { status: res.status });
  return body;
}

export const getJSON = (url) => call(url);

export const postJSON = (url, data) => call(url, {
  method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(data),
});
