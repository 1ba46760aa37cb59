// poolgate's web page: signs in with the admin token (kept in this tab's
// session storage, sent as Authorization, never in a URL), reads the
// gateway's event stream (/ui/events, server-sent events read with fetch so
// the token can go in a header), and draws what it says. Actions go to the
// admin endpoints with the same token, each confirmed first. No framework:
// the DOM is built with createElement and textContent only, so nothing a
// client sent (a model name, a key's team) is ever read as markup.
"use strict";

const TOKEN = "poolgate-admin-token";
const state = { status: null, decisions: [], usage: [], controller: null };
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function token() { return sessionStorage.getItem(TOKEN); }

function duration(ms) {
  if (ms === null || ms === undefined) return "–";
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${s % 60}s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h}h ${m % 60}m`;
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

function clock(ms) { return new Date(ms).toISOString().slice(11, 19); }

function showSignIn(message) {
  if (state.controller) state.controller.abort();
  $("board").hidden = true;
  $("sign-out").hidden = true;
  $("sign-in").hidden = false;
  $("sign-in-error").textContent = message || "";
}

async function connect() {
  const t = token();
  if (!t) return showSignIn();
  state.controller = new AbortController();
  let r;
  try {
    r = await fetch("/ui/events", { headers: { Authorization: `Bearer ${t}` }, signal: state.controller.signal });
  } catch (e) {
    if (e.name === "AbortError") return;
    return retry("the gateway cannot be reached");
  }
  if (r.status === 401 || r.status === 403) {
    sessionStorage.removeItem(TOKEN);
    const body = await r.json().catch(() => ({}));
    return showSignIn(r.status === 401 ? "That token was refused." : (body.error || {}).message || "Admin routes are off.");
  }
  if (!r.ok) return retry(`the gateway answered ${r.status}`);
  $("sign-in").hidden = true;
  $("board").hidden = false;
  $("sign-out").hidden = false;
  notice("");
  await read(r.body.getReader());
}

function retry(why) {
  notice(`Disconnected: ${why}. Trying again…`);
  setTimeout(connect, 2000);
}

async function read(reader) {
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (e) {
      if (e.name === "AbortError") return;
      return retry("the stream broke");
    }
    if (chunk.done) return retry("the stream ended");
    buffer += decoder.decode(chunk.value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      dispatch(buffer.slice(0, end));
      buffer = buffer.slice(end + 2);
    }
  }
}

function dispatch(block) {
  let name = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event: ")) name = line.slice(7);
    else if (line.startsWith("data: ")) data.push(line.slice(6));
  }
  if (!data.length) return;
  const value = JSON.parse(data.join("\n"));
  if (name === "status") { state.status = value; drawStatus(); }
  else if (name === "decision") { state.decisions.unshift(value); state.decisions.length = Math.min(state.decisions.length, 200); drawDecisions(); }
  else if (name === "usage") { state.usage = value; drawUsage(); }
}

function notice(text) { $("notice").textContent = text; }

async function act(what, method, path, body) {
  if (!confirm(`${what}?`)) return null;
  const r = await fetch(path, {
    method,
    headers: { Authorization: `Bearer ${token()}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const answer = await r.json().catch(() => ({}));
  notice(r.ok ? `${what}: done.` : `${what}: ${((answer.error || {}).message) || r.status}`);
  return r.ok ? answer : null;
}

// ---- accounts -----------------------------------------------------------

function windowBar(w, binding, now) {
  const used = Math.max(0, Math.min(1, w.utilization));
  const resets = w.resets_at_ms ? w.resets_at_ms - now : null;
  const name = w.name + (binding ? " (binds)" : "");
  return el("div", { class: `window ${w.status}${binding ? " binding" : ""}` },
    el("span", { class: "window-name" }, name),
    el("meter", { min: 0, max: 1, low: 0.7, high: 0.9, optimum: 0, value: used, "aria-label": `${w.name} used` }),
    el("span", { class: "window-used" }, `${Math.round(w.utilization * 100)}%`),
    el("span", { class: "window-reset", "data-reset": w.resets_at_ms || "" }, resets === null ? "" : `resets in ${duration(resets)}`));
}

function bindingWindow(a) {
  const claim = a.representative_claim;
  const names = { five_hour: "5h", seven_day: "7d" };
  if (claim) return names[claim] || claim.replace(/^seven_day_/, "7d_");
  return null;
}

function accountCard(a, now) {
  const off = !a.enabled || a.runtime_disabled;
  const binds = bindingWindow(a);
  const status = off ? "disabled" : a.cooldown ? "cooling" : a.unified_status || "unknown";
  const card = el("article", { class: `card ${status}`, "data-account": a.id, "aria-label": `account ${a.id}` },
    el("h3", {}, a.alias || a.id, a.alias && a.alias !== a.id ? el("small", {}, ` ${a.id}`) : null),
    el("p", { class: "facts" },
      el("span", { class: "status" }, status),
      ` · ${a.kind}${a.overflow ? " · overflow" : ""} · in flight ${a.in_flight}${a.max_in_flight ? ` / ${a.max_in_flight}` : ""}`,
      a.reading_age_ms !== null && a.reading_age_ms !== undefined ? ` · read ${duration(a.reading_age_ms)} ago` : " · no reading yet"));
  const windows = el("div", { class: "windows" },
    (a.windows || []).map((w) => windowBar(w, binds === w.name, now)));
  card.append(windows);
  if (a.cooldown) {
    card.append(el("p", { class: "cooldown" },
      `Cooling (${a.cooldown.reason}) for ${duration(a.cooldown.until_ms - now)} `,
      el("button", { type: "button", onclick: () => act(`Clear ${a.id}'s cooldown`, "POST", `/admin/accounts/${encodeURIComponent(a.id)}/clear`, {}) }, "Clear")));
  }
  for (const g of a.model_gates || []) {
    card.append(el("p", { class: "cooldown" }, `${g.family} gated for ${duration(g.until_ms - now)}`));
  }
  if (a.oauth) {
    const o = a.oauth;
    const who = o.identity && (o.identity.email || o.identity.account);
    const seat = [`token expires in ${duration(o.token_expires_at_ms - now)}`, `${o.refreshes} refreshes`];
    if (who) seat.unshift(who);
    if (o.last_refresh_ms) seat.push(`last ${duration(now - o.last_refresh_ms)} ago`);
    if (o.needs_login) seat.push(`needs login${o.fix ? `: ${o.fix}` : ""}`);
    if (o.last_error) seat.push(`last error: ${o.last_error}`);
    if (o.backoff_until_ms && o.backoff_until_ms > now) seat.push(`retrying in ${duration(o.backoff_until_ms - now)}`);
    card.append(el("p", { class: o.needs_login ? "seat cooldown" : "seat" }, `Seat: ${seat.join(" · ")}`));
  }
  if (a.organization_id) card.append(el("p", { class: "facts" }, `Organization ${a.organization_id}`));
  const toggle = a.runtime_disabled
    ? el("button", { type: "button", onclick: () => act(`Enable ${a.id}`, "POST", `/admin/accounts/${encodeURIComponent(a.id)}/enable`, {}) }, "Enable")
    : el("button", { type: "button", disabled: !a.enabled, onclick: () => act(`Disable ${a.id}`, "POST", `/admin/accounts/${encodeURIComponent(a.id)}/disable`, { by: "web page" }) }, "Disable");
  card.append(el("p", { class: "buttons" }, toggle));
  return card;
}

function drawStatus() {
  const s = state.status;
  const now = s.now_ms;
  $("accounts").replaceChildren(...s.accounts.map((a) => accountCard(a, now)));
  const serving = s.accounts.filter((a) => a.enabled && !a.runtime_disabled && !a.cooldown).length;
  $("summary").textContent = `${serving} of ${s.accounts.length} accounts serving · config generation ${s.config.generation} · up ${duration(s.uptime_ms)}`;
  $("chain").tBodies[0].replaceChildren(...s.chain.map((st) => el("tr", {},
    el("td", {}, st.name), el("td", {}, st.plugin), el("td", { class: "mono" }, (st.sha256 || "").slice(0, 12)),
    el("td", { class: `breaker ${st.breaker.state}` }, st.breaker.state),
    el("td", { class: "faults" }, ["rank", "observe", "configure"].map((p) => {
      const h = st[p] || {};
      const causes = Object.entries(h.by_cause || {}).map(([c, n]) => `${c} ${n}`).join(", ");
      return `${p} ${h.failures || 0}/${h.calls || 0}${causes ? ` (${causes})` : ""}${h.busy ? ` · busy ${h.busy}` : ""}`;
    }).join(" · ")),
    el("td", {}, Object.entries(st.call_ms || {}).map(([k, v]) => `${k} ${v} ms`).join(" · ")))));
  const reload = s.config.last_reload;
  const items = [
    ["Version", s.version],
    ["Last reload", reload ? `${reload.ok ? "applied" : "refused"} by ${reload.trigger} at ${clock(reload.at_ms)}${(reload.errors || []).length ? `: ${reload.errors.join("; ")}` : ""}` : "none"],
    ["Queue", String(s.queue_depth)],
    ["Fallback", (s.fallback || []).length ? s.fallback.map((f) => `${f.backend}: ${f.served} answered`).join(" · ") : "none configured"],
    ["Replica backend", s.state_backend ? `${s.state_backend.kind}${s.state_backend.connected === false ? " (down)" : ""}` : "–"],
    ["Ledger", s.ledger ? `${s.ledger.store}${s.ledger.down ? ` — down: ${s.ledger.down}` : ""} · ${s.ledger.written} written, ${s.ledger.dropped} dropped` : "off"],
  ];
  $("gateway").replaceChildren(...items.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  $("reloads").replaceChildren(...(s.config.reloads || []).map((r) =>
    el("li", { class: r.ok ? "" : "cooldown" }, `${clock(r.at_ms)} ${r.ok ? "applied" : "refused"} by ${r.trigger}${r.consecutive_failures > 1 ? ` (${r.consecutive_failures} times)` : ""}${(r.errors || []).length ? `: ${r.errors.join("; ")}` : ""}`)));
  $("actions").replaceChildren(...(s.admin_actions || []).slice(-10).reverse().map((x) =>
    el("li", {}, `${clock(x.at_ms)} ${x.by}: ${x.action} ${x.account}${x.result ? ` — ${x.result}` : ""}${x.note ? ` (${x.note})` : ""}`)));
}

// ---- decisions ----------------------------------------------------------

function stageLines(d) {
  const last = d.attempts && d.attempts.length ? d.attempts[d.attempts.length - 1].decision : null;
  if (!last) return [];
  return (last.stages || []).map((st) => el("li", {}, `${st.stage}: ${st.reason}${st.error ? ` (fault: ${JSON.stringify(st.error)})` : ""}`));
}

function drawDecisions() {
  const f = new FormData($("filters"));
  const match = (v, q) => !q || (v || "").toLowerCase().includes(q.toLowerCase());
  const rows = state.decisions.filter((d) => match(d.session, f.get("session")) && match(d.client, f.get("client")) && match(d.account, f.get("account")));
  $("decisions").tBodies[0].replaceChildren(...rows.slice(0, 100).map((d) => {
    const passed = (d.passed_over || []).map((p) => `${p.account}: ${p.cause}`).join("; ");
    return el("tr", { "data-request": d.id },
      el("td", {}, clock(d.at_ms)), el("td", { class: "mono" }, String(d.id)), el("td", {}, d.client || "–"),
      el("td", {}, d.model), el("td", {}, d.fallback ? `fallback ${d.fallback}` : d.account || "–"),
      el("td", {}, String(d.status)),
      el("td", {}, el("details", {}, el("summary", {}, d.reason || "–"),
        passed ? el("p", {}, `Passed over: ${passed}`) : null,
        el("ul", { class: "stages" }, stageLines(d)))));
  }));
}

// ---- usage --------------------------------------------------------------

function drawUsage() {
  const fmt = (p) => p ? `${p.tokens} tok · $${p.cost_usd.toFixed(4)} · ${p.requests} req` : "–";
  $("usage").tBodies[0].replaceChildren(...state.usage.map((k) => {
    const day = k.usage.find((u) => u.period === "day");
    const month = k.usage.find((u) => u.period === "month");
    const budgets = (k.budgets || []).map((b) => `${b.period} ${b.remaining} ${b.unit} left`).join(" · ");
    return el("tr", { "data-key": k.key },
      el("td", {}, k.key), el("td", {}, k.team || ""), el("td", { class: "day" }, fmt(day)), el("td", {}, fmt(month)),
      el("td", {}, budgets || "none"),
      el("td", {}, el("button", { type: "button", onclick: () => act(`Revoke key ${k.key}`, "POST", `/admin/keys/${encodeURIComponent(k.key)}/revoke`, {}) }, "Revoke")));
  }));
}

// ---- start --------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("sign-in-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN, $("token").value);
    $("token").value = "";
    connect();
  });
  $("sign-out").addEventListener("click", () => { sessionStorage.removeItem(TOKEN); showSignIn("Signed out."); });
  $("filters").addEventListener("input", drawDecisions);
  $("reload").addEventListener("click", async () => {
    const r = await act("Reload the configuration", "POST", "/admin/reload");
    if (r) notice(`Reload the configuration: applied, generation ${r.generation}${r.superseded_by ? ` (by ${r.superseded_by})` : ""}.`);
  });
  $("new-key").addEventListener("submit", async (e) => {
    e.preventDefault();
    const f = new FormData(e.target);
    const body = { name: f.get("name") };
    if (f.get("team")) body.team = f.get("team");
    const made = await act(`Create key ${body.name}`, "POST", "/admin/keys", body);
    if (made) $("new-key-secret").textContent = `Key ${body.name}: ${made.key} — shown once; copy it now.`;
  });
  // A sign-in link's one-time ticket (in the fragment, which no server
  // sees): traded for a session, and taken out of the address at once.
  const ticket = new URLSearchParams(location.hash.slice(1)).get("ticket");
  if (ticket) {
    history.replaceState(null, "", location.pathname);
    fetch("/ui/sign-in", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ticket }) })
      .then(async (r) => {
        if (r.ok) { sessionStorage.setItem(TOKEN, (await r.json()).token); connect(); }
        else showSignIn("That sign-in link was used already or is too old: sign in with the admin token.");
      });
  }
  // Countdowns move between status events.
  setInterval(() => {
    const now = Date.now();
    for (const r of document.querySelectorAll("[data-reset]")) {
      const at = Number(r.dataset.reset);
      if (at) r.textContent = `resets in ${duration(at - now)}`;
    }
  }, 1000);
  if (!ticket) connect();
});
