// wxgate console: reads the admin API (/v1) of the listener that served it,
// every `every` seconds (?every=N, 1-60, default 5). No other origin, no
// inline code (the page's Content-Security-Policy forbids both); every
// value shown goes in as text, never as markup.
"use strict";

const params = new URLSearchParams(location.search);
const every = Math.min(60, Math.max(1, Number(params.get("every")) || 5));
const TOP = 20;
const SVG = "http://www.w3.org/2000/svg";
let search = "";
let errcodesSeen = [];
// The history changes every 10 s: read no more often than that.
let history = null, historyAt = 0;

function $(id) { return document.getElementById(id); }

// An element with attributes and children (strings become text nodes).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "onclick") e.addEventListener("click", v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function fill(tbodyOf, rows, noneId) {
  const body = $(tbodyOf).tBodies[0];
  body.replaceChildren(...rows);
  if (noneId) $(noneId).hidden = rows.length > 0;
}

class Unauthorized extends Error {}

// Every request goes to the page's origin as an absolute URL: a page
// opened as http://user:token@host/ has the credentials in its own URL,
// and fetch() refuses a URL resolved against it ("cannot be constructed
// from a URL that includes credentials"). The origin has none; the
// browser sends the credentials it was given for it (HTTP Basic) itself.
function api(path) { return new URL(path, location.origin).href; }

async function get(path) {
  const r = await fetch(api(path), { headers: { Accept: "application/json" }, cache: "no-store" });
  if (r.status === 401) throw new Unauthorized();
  const body = await r.json().catch(() => ({}));
  if (!r.ok) { const e = new Error(body.error || r.status + " " + r.statusText); e.status = r.status; throw e; }
  return body;
}

async function act(method, path, question) {
  if (!window.confirm(question)) return;
  try {
    const r = await fetch(api(path), { method, headers: { Accept: "application/json" } });
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(body.error || r.status + " " + r.statusText);
    problem("");
  } catch (e) {
    problem("action failed: " + e.message);
  }
  refresh();
}

function problem(text) { const p = $("problem"); p.textContent = text; p.hidden = !text; }

function seconds(s) {
  if (s === null || s === undefined) return "–";
  s = Math.round(s);
  if (s < 90) return s + " s";
  if (s < 5400) return Math.round(s / 60) + " min";
  if (s < 172800) return (s / 3600).toFixed(1) + " h";
  return Math.round(s / 86400) + " d";
}

// Every time on the page is shown in the quota's time zone (the zone of
// WeChat's days, of /v1/health's `now`), whatever zone the API wrote it in:
// errcodes and penalties come in that zone, reloads and drained-at in UTC.
let zoneMinutes = 0;
function zoneOf(t) {
  const m = /([+-])(\d\d):(\d\d)$/.exec(String(t));
  return m ? (m[1] === "-" ? -1 : 1) * (Number(m[2]) * 60 + Number(m[3])) : 0;
}
function zoneName() {
  const a = Math.abs(zoneMinutes), two = n => String(n).padStart(2, "0");
  return `UTC${zoneMinutes < 0 ? "-" : "+"}${two(Math.floor(a / 60))}:${two(a % 60)}`;
}
function clock(t) {
  const ms = t ? Date.parse(t) : NaN;
  return Number.isNaN(ms) ? "–" : new Date(ms + zoneMinutes * 60000).toISOString().slice(0, 19).replace("T", " ");
}
function pct(f) { return (f * 100).toFixed(f < 0.1 ? 1 : 0) + " %"; }
const path = (...parts) => "/v1/" + parts.map(encodeURIComponent).join("/");

// A small bar of `f` (0-1).
function bar(f) {
  const w = 90, cls = f >= 0.95 ? "bar bad" : f >= 0.8 ? "bar warn" : "bar";
  return svg("svg", { width: w, height: 10, role: "img", "aria-label": pct(f) },
    svg("rect", { class: "bar-bg", width: w, height: 10, rx: 2 }),
    svg("rect", { class: cls, width: Math.max(0, Math.min(1, f)) * w, height: 10, rx: 2 }));
}

function dayQuota(pair) {
  return (pair.limits || []).find(l => l.kind === "calendar" && (l.limit || "").endsWith("day")) ||
    (pair.limits || []).find(l => l.kind === "calendar");
}

function windowFill(pair) {
  let worst = null;
  for (const l of pair.limits || []) {
    if (l.kind !== "window" || !l.burst) continue;
    const f = 1 - (l.tokens || 0) / l.burst;
    if (worst === null || f > worst.f) worst = { f, l };
  }
  return worst;
}

function lastErrcode(account, rule) {
  const e = errcodesSeen.find(e => e.account === account && e.rule === rule && e.penalty_seconds !== null);
  return e ? e.errcode : null;
}

function actions(account, rule, penalised) {
  const out = [];
  if (penalised) {
    out.push(el("button", { class: "act", title: "DELETE " + path("penalties", account, rule),
      onclick: () => act("DELETE", path("penalties", account, rule),
        `Lift the penalty of ${account} on ${rule}? WeChat may still be refusing this account: lift it once its clear_quota is done or its time is known to be over.`) }, "lift penalty"));
  }
  out.push(el("button", { class: "act", title: "POST " + path("accounts", account, "clear"),
    onclick: () => act("POST", path("accounts", account, "clear"),
      `Mark clear_quota done for ${account}? Its day counts start again from 0 and its penalties are lifted, on every instance.`) }, "clear_quota done"));
  return out;
}

function accountRow(p) {
  const day = dayQuota(p), wf = windowFill(p), pen = p.penalty || {}, fc = p.forecast;
  const used = day ? day.used : null, count = day ? day.count : null;
  const learned = day && day.learned && day.learned.applies ? ` (learned; configured ${day.configured})` : "";
  const frac = fc ? fc.used_fraction : (count ? used / count : 0);
  const rule = p.rule + (p.path ? " " + p.path : "");
  return el("tr", { "data-account": p.account, "data-rule": p.rule },
    el("td", {}, p.account), el("td", {}, rule),
    el("td", {}, day ? [bar(frac), " ", pct(frac)] : "–"),
    el("td", { class: "num" }, day ? `${used} / ${count}${learned}` : "no day quota"),
    el("td", {}, wf ? [bar(wf.f), " ", pct(wf.f)] : "–"),
    el("td", { class: pen.active ? "bad" : "" }, pen.active ? seconds(pen.remaining_seconds) + (pen.level ? ` (escalated ×${pen.level})` : "") : "–"),
    el("td", { class: fc && fc.runs_out_at ? "warn" : "" }, fc && fc.runs_out_at ? clock(fc.runs_out_at) : "–"),
    el("td", {}, actions(p.account, p.rule, pen.active)));
}

function renderHealth(h, callers) {
  const s = h.store;
  $("store").textContent = s.kind + ": " + s.decisions;
  $("store").className = s.degraded ? "pill bad" : "pill";
  const up = h.upstreams.filter(u => u.up).length;
  const card = (title, ...lines) => el("div", { class: "card" }, el("b", {}, title), ...lines.filter(l => l !== null).map(l => el("div", {}, l)));
  const rl = h.reloads;
  $("health").replaceChildren(
    card("store", s.decisions, s.fallback ? `fallback ${s.fallback} · ${s.instances} instances${s.quota_leases ? " · leases" : ""}` : null,
      `errors ${s.errors} · breaker opened ${s.breaker_opened}`, `degraded decisions ${s.degraded_decisions} · lost ${s.lost}`),
    card("upstreams", el("span", { class: up === h.upstreams.length ? "ok" : "bad" }, `${up} of ${h.upstreams.length} up`),
      ...h.upstreams.filter(u => !u.up).map(u => `${u.upstream}: skipped ${seconds(u.skipped_for_s)}`)),
    card("tokens", `fetched ${h.tokens.fetched} · from cache ${h.tokens.from_cache}`,
      el("span", { class: h.tokens.renewal_errors ? "bad" : "" }, `renewed ${h.tokens.renewed} · renewal errors ${h.tokens.renewal_errors}`),
      `invalidated ${h.tokens.invalidated} · resent ${h.tokens.resent}`),
    card("config reloads", `ok ${rl.ok} · failed ${rl.failed}`,
      rl.last_at ? el("span", { class: rl.last_error ? "bad" : "" }, `last ${clock(rl.last_at)}: ${rl.last_error || "ok"}`) : "none since start"),
    card("held now", String(h.held_now), `callers declared ${callers.callers.length}`));
}

function renderPlots(history) {
  const readings = history.readings;
  const rules = [...new Set(readings.flatMap(r => Object.keys(r.rules)))];
  const draw = (id, field) => {
    const W = 460, H = 130, L = 34, B = 16;
    let max = 0;
    for (const r of readings) for (const v of Object.values(r.rules)) max = Math.max(max, v[field]);
    max = max > 0 ? max * 1.1 : 1;
    const pic = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `${field} calls per second` });
    pic.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W, y2: H - B }),
      svg("text", { class: "axis-label", x: 2, y: 10 }, max.toPrecision(2)),
      svg("text", { class: "axis-label", x: 2, y: H - B }, "0"),
      svg("text", { class: "axis-label", x: L, y: H - 3 }, "−60 min"),
      svg("text", { class: "axis-label", x: W - 28, y: H - 3 }, "now"));
    const n = 360;
    rules.forEach((rule, i) => {
      const pts = readings.map((r, k) => {
        const x = L + (W - L) * (n - readings.length + k) / (n - 1);
        const v = (r.rules[rule] || {})[field] || 0;
        return `${x.toFixed(1)},${(H - B - (H - B - 4) * v / max).toFixed(1)}`;
      });
      if (pts.length) pic.append(svg("polyline", { class: "s" + (i % 8), points: pts.join(" ") }));
    });
    $(id).replaceChildren(pic);
  };
  draw("plot-admitted", "admitted");
  draw("plot-refused", "refused");
  $("legend").replaceChildren(...rules.map((r, i) => el("span", { class: "s" + (i % 8) }, r)));
  if (!readings.length) $("legend").replaceChildren(el("span", { class: "muted" }, `first reading in ${history.every_seconds} s`));
}

// The penalties in force as the store holds them (/v1/penalties: whatever
// set them, on any instance, restored after a restart), ending last first.
function renderPenalties(penalties) {
  fill("penalties", penalties.pairs.map(p => el("tr", { "data-account": p.account, "data-rule": p.rule },
    el("td", {}, p.account), el("td", {}, p.rule + (p.path ? " " + p.path : "")), el("td", { class: "bad" }, seconds(p.penalty.remaining_seconds)),
    el("td", {}, clock(p.penalty.until)), el("td", { class: "num" }, p.penalty.level || "–"),
    el("td", {}, String(lastErrcode(p.account, p.rule) ?? "not seen here")),
    el("td", {}, actions(p.account, p.rule, true)))), "penalties-none");
  $("penalties-more").hidden = !penalties.more;
  $("penalties-more").textContent = `The ${penalties.pairs.length} ending last are shown; more are in force.`;
}

const pairKey = p => [p.account, p.rule, p.path || ""].join("\n");

function renderErrcodes(list) {
  fill("errcodes", list.slice(0, 30).map(e => el("tr", {},
    el("td", {}, clock(e.at)), el("td", { class: String(e.errcode).startsWith("45") ? "bad" : "warn" }, String(e.errcode)),
    el("td", {}, e.rule || "–"), el("td", {}, e.account),
    el("td", {}, e.penalty_seconds === null ? "–" : seconds(e.penalty_seconds)))), "errcodes-none");
}

function renderCallers(c) {
  const refusals = ["throttled", "penalised", "unavailable", "unauthorized", "rejected_bad_request"];
  const row = (name, priority, calls, extra, accounts) => {
    calls = calls || {};
    const total = Object.values(calls).reduce((a, b) => a + b, 0);
    const reasons = refusals.filter(r => calls[r]).map(r => `${r} ${calls[r]}`).concat(extra);
    const refused = refusals.reduce((a, r) => a + (calls[r] || 0), 0);
    return el("tr", {}, el("td", {}, name), el("td", {}, priority), el("td", { class: "num" }, total),
      el("td", { class: "num" + (refused ? " warn" : "") }, refused), el("td", {}, reasons.join(" · ") || "–"), el("td", {}, accounts));
  };
  const rows = c.callers.map(x => row(x.name, x.priority, x.calls,
    [x.rate_refusals_here ? `flood guard ${x.rate_refusals_here}` : null].filter(Boolean),
    x.accounts === null || x.accounts === undefined ? "any" : x.accounts.join(", ")));
  if (c.undeclared) rows.push(row(c.undeclared_label + " (undeclared)", "normal", c.undeclared.calls, [], "any"));
  fill("callers", rows);
  const pick = $("job-caller"), names = c.callers.map(x => x.name).concat([c.undeclared_label]);
  if (pick.options.length !== names.length) pick.replaceChildren(...names.map(n => el("option", { value: n }, n)));
}

function renderQueues(q) {
  $("queues-off").hidden = q.on;
  $("queues").hidden = !q.on;
  $("job").hidden = !q.on;
  if (!q.on) return;
  fill("queues", q.queues.map(x => el("tr", {},
    el("td", {}, x.caller), el("td", {}, x.rule), el("td", { class: "num" }, x.accounts),
    el("td", { class: "num" }, x.queued), el("td", { class: "num" }, x.waiting), el("td", { class: "num" }, x.sending),
    el("td", {}, seconds(x.oldest_age_seconds)), el("td", { class: "num" }, x.sent), el("td", { class: "num" + (x.failed ? " warn" : "") }, x.failed),
    el("td", { class: "num" }, x.expired), el("td", { class: "num" }, x.cancelled), el("td", { class: "num" + (x.unknown ? " bad" : "") }, x.unknown),
    el("td", {}, x.queued + x.waiting === 0 ? "drained" : (x.drained_at ? clock(x.drained_at) : "not known")))));
}

async function lookUp(caller, id) {
  const out = $("job-result");
  try {
    const job = await get(path("deliveries", caller, id));
    const cancellable = ["queued", "waiting"].includes(job.state);
    out.replaceChildren(el("pre", {}, JSON.stringify(job, null, 2)),
      cancellable ? el("button", { class: "act", onclick: async () => {
        await act("DELETE", path("deliveries", caller, id), `Cancel delivery ${id} of ${caller}? It will not be sent.`);
        lookUp(caller, id);
      } }, "cancel delivery") : "");
  } catch (e) {
    out.replaceChildren(el("p", { class: "bad" }, e.message));
  }
}

let running = false;
async function refresh() {
  if (running) return;
  running = true;
  try {
    // A search lists the tracked accounts containing it, and the one it
    // names exactly on every rule (tracked or not).
    const top = !search ? get(`/v1/accounts?top=${TOP}`) : Promise.all([
      get(`/v1/accounts?top=${TOP}&q=${encodeURIComponent(search)}`),
      get(path("accounts", search)).catch(() => ({ pairs: [] }))])
      .then(([some, one]) => ({ tracked: some.tracked, pairs: one.pairs.concat(some.pairs.filter(p => p.account !== search)) }));
    const stale = Date.now() - historyAt >= 10000;
    const [health, callers, errcodes, read, accounts, queues, penalties] = await Promise.all([
      get("/v1/health"), get("/v1/callers"), get("/v1/errcodes"), stale ? get("/v1/history") : null, top,
      get("/v1/queues"), get("/v1/penalties")]);
    if (read) { history = read; historyAt = Date.now(); }
    zoneMinutes = zoneOf(health.now);
    errcodesSeen = errcodes.errcodes;
    renderHealth(health, callers);
    renderPlots(history);
    renderErrcodes(errcodes.errcodes);
    renderCallers(callers);
    renderQueues(queues);
    // Pairs under a penalty are listed too, after the others, whether this
    // instance admitted calls of them lately or not.
    const listed = new Set(accounts.pairs.map(pairKey));
    const penalised = penalties.pairs.filter(p => !listed.has(pairKey(p)) && (!search || p.account.includes(search)));
    const pairs = accounts.pairs.concat(penalised);
    fill("accounts", pairs.map(accountRow));
    const also = penalised.length ? `, and ${penalised.length} more under a penalty` : "";
    $("accounts-note").textContent = search ? `Accounts matching ${search}: ${pairs.length} pairs.`
      : `Top ${accounts.pairs.length} of ${accounts.tracked} pairs admitted here in the last hour, by share of the day quota used${also}.`;
    renderPenalties(penalties);
    $("refreshed").textContent = `updated ${clock(health.now).slice(11)} · times in ${zoneName()} · every ${every} s`;
    problem("");
    // Refreshes completed (tests wait for one that started after a change).
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
  } catch (e) {
    problem(e instanceof Unauthorized ? "signed out: reload the page and give the admin token" : "refresh failed: " + e.message);
  } finally {
    running = false;
  }
}

$("search").addEventListener("submit", ev => { ev.preventDefault(); search = $("q").value.trim(); refresh(); });
$("clear-search").addEventListener("click", () => { $("q").value = ""; search = ""; refresh(); });
$("job").addEventListener("submit", ev => { ev.preventDefault(); lookUp($("job-caller").value, $("job-id").value.trim()); });
refresh();
setInterval(refresh, every * 1000);
