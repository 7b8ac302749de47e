// spacepool dashboard: polls /api/admin/pool-stats with the admin token and fills the page.
//
// * The token lives in sessionStorage (this tab only), or in this page's memory only while
//   the service serves Spaces' pages (see MEMORY_ONLY), and goes out as a bearer header; it
//   is never put in a URL, and a refused token is forgotten at once.
// * Nothing from the pool is on the page before the API has accepted the token, and all
//   of it is removed again when the token is forgotten or refused.
// * Every figure is an element with data-stat (a JSON path into the stats): its text is
//   the value as the API gave it, or "—" when the API does not report it, so what the page
//   says can be checked against the API field by field. Data goes in with textContent only.
// * Polls run one at a time, every 2 s; a poll that fails or hangs, or no successful one for
//   5 s, shows the "stale" marker until the next success.
"use strict";

(() => {
  const STATS_URL = "/api/admin/pool-stats";
  const USAGE_URL = "/api/admin/usage";
  const KEYS_URL = "/api/admin/keys";
  const KEYLESS = { open: "no key (callers without an API key)", token: "POOL_API_TOKEN (the shared token)" };
  // What each figure means, shown on hover (title) and to screen readers: keyed by the
  // last part of its data-stat path (the first match of the path's parts, from the end).
  const EXPLAIN = {
    globalInUse: "Predicts holding a slot of the global cap now, across every worker and host",
    globalLimit: "The global cap, POOL_GLOBAL_MAX_CONCURRENT: predicts in flight at most, fleet-wide",
    consumerLimit: "Per-user cap, POOL_CONSUMER_MAX_CONCURRENT: one email's predicts in flight at most",
    store: "The admission store (POOL_COORDINATOR_URL's kind) every worker shares",
    reachable: "Whether the admission store answered this poll; without it nothing is admitted",
    totalQueued: "Requests waiting for admission now, fleet-wide",
    interactive: "Waiting requests of the interactive class",
    batch: "Waiting requests of the batch class (priority: batch)",
    p50: "Median wait for admission over this worker's recent admissions (ms)",
    p95: "95th percentile of the wait for admission over this worker's recent admissions (ms)",
    p99: "99th percentile of the wait for admission over this worker's recent admissions (ms)",
    oldestMs: "The longest wait still in progress, fleet-wide (ms)",
    p95Ms: "95th percentile of the ages of the waits still in progress (ms)",
    count: "Waits for admission in progress now, fleet-wide",
    userAssignments: "Users pinned to a Space (a pin lasts POOL_ASSIGNMENT_TTL_S)",
    requestsPerMinute: "Requests that ended in the last minute, every worker",
    processes: "Worker processes that published their figures in the last few seconds",
    inUseConnections: "Connections serving a predict now",
    availableConnections: "Open connections idle and ready",
    totalConnections: "Open connections, in use or idle",
    initialized: "Whether this worker's pool has started (it starts with the service)",
    lastHealthCheck: "When the last health round ended (UTC): it probes idle connections of every Space",
    nextHealthCheck: "When the next health round is due (every POOL_HEALTH_INTERVAL_S)",
    healthCheckRunning: "Whether a health round runs now",
    up: "up: the Space takes calls; down: it failed and is routed around for a cool-down",
    unhealthyConnections: "Connections that failed their health probe, about to be replaced",
    maxConnections: "POOL_MAX_CONNECTIONS: the most connections to one Space per worker",
    minConnections: "POOL_MIN_CONNECTIONS: the connections kept open to one Space per worker",
    openingConnections: "Connections being opened now",
    keptWarm: "Idle connections kept: the peak in use over POOL_WARM_WINDOW_S, at least the minimum",
    queueLength: "Requests waiting for this Space now",
    spaceInFlight: "Predicts running on this Space now, fleet-wide",
    current: "The Space's adaptive window now: its admission limit fleet-wide",
    ceiling: "The most the window may grow to (POOL_WINDOW_MAX, POOL_MAX_CONNECTIONS)",
    initial: "The window at start (POOL_WINDOW_INITIAL)",
    peak: "The largest the window has been",
    state: "closed: calls go through; open: the Space is skipped until the cool-down ends; half_open: one probe call decides",
    consecutiveFailures: "Provider failures in a row (POOL_BREAKER_FAILURES of them open the breaker)",
    transitions: "Times the breaker changed state",
    openUntil: "When an open breaker lets one probe call through (UTC)",
    deadline: "The wake deadline of a sleeping Space (UTC)",
    kind: "The class of the Space's last failed call, any worker (kept after it recovers)",
    at: "When it happened (UTC)",
    lastError: "The failure that has this worker routing around the Space now; — when it is up",
    result: "The last health probe's result on one of the Space's idle connections",
    "wake.state": "The Space's wake state: idle, or waking a sleeping Space until it answers",
    "lastProbe.at": "When the last health probe of this Space ran (UTC)",
    "lastFailure.at": "When its last failed call ended (UTC)",
    errors: "Failed calls of this class on this Space in the last 15 minutes, every worker",
  };
  const USAGE_MS = 10000;
  const DAY_MS = 24 * 3600 * 1000;
  const SVG = "http://www.w3.org/2000/svg";
  const KEY = "spacepool.adminToken";
  const POLL_MS = 2000;
  const STALE_MS = 5000;
  const TIMEOUT_MS = 4000;
  const WINDOW_S = 900; // the queue history the server keeps
  const MIN_SPAN_S = 120; // the chart's shortest time axis, while history is short
  const DASH = "—";

  const $ = (id) => document.getElementById(id);
  let generation = 0; // bumped when the token changes: late answers are dropped
  let timer = null;
  let lastOk = 0;
  let lastOkText = DASH;
  let failure = "";
  let lastHealth = null;
  let nextHealth = null; // pool-stats nextHealthCheck: shown as "next at" before the first
  let memoryToken = null; // used only when sessionStorage is unavailable
  let cards = 0; // ids for the Space cards' headings
  let usageAt = 0; // when the usage was last asked for

  // -- token --------------------------------------------------------------------------
  // While the service serves Spaces' own pages (POOL_GRADIO_PAGES), their script runs on
  // this origin and could read sessionStorage: the server then marks the page
  // (data-token-store="memory") and the token lives in this page's memory only, asked at
  // each visit, never stored (a token stored by an earlier visit is removed).
  const MEMORY_ONLY = document.body.dataset.tokenStore === "memory";
  if (MEMORY_ONLY) {
    try {
      sessionStorage.removeItem(KEY);
    } catch (e) {
      /* nothing stored */
    }
  }

  function token() {
    if (MEMORY_ONLY) return null;
    try {
      return sessionStorage.getItem(KEY);
    } catch (e) {
      return null;
    }
  }

  function storeToken(value) {
    if (MEMORY_ONLY) {
      memoryToken = value;
      return;
    }
    try {
      sessionStorage.setItem(KEY, value);
    } catch (e) {
      memoryToken = value; // storage refused: keep it for this page's life only
    }
  }

  function currentToken() {
    return token() || memoryToken;
  }

  function forget(message) {
    generation += 1;
    clearTimeout(timer);
    timer = null;
    try {
      sessionStorage.removeItem(KEY);
    } catch (e) {
      /* nothing stored */
    }
    memoryToken = null;
    clearDashboard();
    $("dashboard").hidden = true;
    $("forget").hidden = true;
    $("login").hidden = false;
    setStatus("idle", "Not connected");
    const error = $("login-error");
    error.textContent = message || "";
    error.hidden = !message;
    $("token").focus();
  }

  // -- formatting -----------------------------------------------------------------------
  function lookup(data, path) {
    let value = data;
    for (const key of path) {
      if (value === null || typeof value !== "object" || !(key in value)) return undefined;
      value = value[key];
    }
    return value;
  }

  function utc(iso) {
    const at = new Date(iso);
    if (Number.isNaN(at.getTime())) return String(iso);
    return at.toISOString().slice(0, 19).replace("T", " ") + " UTC";
  }

  function format(value, kind) {
    if (value === undefined || value === null) return DASH;
    if (kind === "time") return utc(value);
    if (kind === "updown") return value === true ? "up" : value === false ? "down" : String(value);
    if (typeof value === "boolean") return value ? "yes" : "no";
    if (typeof value === "object") return DASH;
    return String(value);
  }

  function explain(el) {
    if (el.title) return;
    const path = JSON.parse(el.dataset.stat || el.dataset.field || "[]");
    for (let i = path.length - 1; i >= 0; i--) {
      const pair = i > 0 ? `${path[i - 1]}.${path[i]}` : "";
      const text = EXPLAIN[pair] || EXPLAIN[path[i]];
      if (typeof path[i] === "string" && text) {
        el.title = text;
        return;
      }
    }
  }

  function fill(el, value) {
    explain(el);
    const kind = el.dataset.kind || "";
    el.textContent = format(value, kind);
    if (kind === "time") {
      if (value === undefined || value === null) el.removeAttribute("datetime");
      else el.setAttribute("datetime", String(value));
    }
    if (kind === "state" || kind === "updown") {
      el.dataset.value = value === undefined || value === null ? "" : String(value);
    }
  }

  function setBar(bar, value, max, min, label) {
    const v = typeof value === "number" ? value : 0;
    const m = typeof max === "number" && max > 0 ? max : 0;
    const pct = m ? Math.min(100, (v / m) * 100) : 0;
    bar.querySelector(".fill").style.width = (v > 0 ? Math.max(pct, 1.5) : 0) + "%";
    bar.dataset.value = String(v);
    bar.setAttribute("aria-valuenow", String(v));
    bar.setAttribute("aria-valuemax", String(m));
    let text = `${label}: ${v} of ${m || DASH}`;
    const mark = bar.querySelector(".min-mark");
    if (mark) {
      if (typeof min === "number" && m) {
        mark.style.left = Math.min(100, (min / m) * 100) + "%";
        mark.hidden = false;
        text += `, minimum ${min}`;
      } else {
        mark.hidden = true;
      }
    }
    bar.setAttribute("aria-valuetext", text);
    bar.setAttribute("aria-label", label);
  }

  // -- rendering --------------------------------------------------------------------------
  function render(data) {
    for (const el of document.querySelectorAll("#dashboard [data-stat]")) {
      if (el.closest("#spaces")) continue;
      fill(el, lookup(data, JSON.parse(el.dataset.stat)));
    }
    const admission = data.admission || {};
    setBar($("cap-bar"), admission.globalInUse, admission.globalLimit, undefined, "Global cap in use");
    renderQueue(data.queueHistory, data.totalQueued);
    renderSpaces(data.pools || {});
    lastHealth = data.lastHealthCheck || null;
    nextHealth = data.nextHealthCheck || null;
    tickAges();
    document.body.dataset.renders = String(Number(document.body.dataset.renders) + 1);
  }

  function spaceCard(name) {
    const container = $("spaces");
    for (const card of container.children) {
      if (card.dataset.space === name) return card;
    }
    const card = $("space-template").content.firstElementChild.cloneNode(true);
    card.dataset.space = name;
    cards += 1;
    const id = `space-${cards}-title`;
    const title = card.querySelector("h3");
    title.id = id;
    card.setAttribute("aria-labelledby", id);
    card.querySelector(".name").textContent = name;
    for (const el of card.querySelectorAll("[data-field]")) {
      el.dataset.stat = JSON.stringify(["pools", name, ...JSON.parse(el.dataset.field)]);
    }
    // Keep cards in name order, as the API's keys may come in any order.
    const after = [...container.children].find((c) => c.dataset.space > name);
    container.insertBefore(card, after || null);
    return card;
  }

  function renderSpaces(pools) {
    const names = Object.keys(pools).sort();
    for (const card of [...$("spaces").children]) {
      if (!(card.dataset.space in pools)) card.remove();
    }
    for (const name of names) {
      const entry = pools[name] || {};
      const card = spaceCard(name);
      for (const el of card.querySelectorAll("[data-field]")) {
        fill(el, lookup(entry, JSON.parse(el.dataset.field)));
      }
      for (const group of card.querySelectorAll("[data-group]")) {
        const present = entry[group.dataset.group] && typeof entry[group.dataset.group] === "object";
        group.classList.toggle("absent", !present);
      }
      const labels = {
        inUseConnections: "in use",
        availableConnections: "available",
        unhealthyConnections: "unhealthy",
      };
      for (const bar of card.querySelectorAll("[data-bar]")) {
        const key = bar.dataset.bar;
        setBar(bar, entry[key], entry.maxConnections, entry.minConnections, `${name} connections ${labels[key]}`);
      }
      renderErrors(card.querySelector(".errors"), name, entry.errors);
      card.classList.toggle("down", entry.up === false);
    }
    $("space-count").textContent = `(${names.length})`;
  }

  function renderErrors(list, name, errors) {
    list.replaceChildren();
    if (errors === undefined || errors === null || typeof errors !== "object") {
      const li = document.createElement("li");
      li.className = "none";
      li.textContent = DASH;
      list.append(li);
      return;
    }
    const classes = Object.keys(errors).sort();
    if (!classes.length) {
      const li = document.createElement("li");
      li.className = "none";
      li.textContent = "none";
      list.append(li);
      return;
    }
    for (const cls of classes) {
      const li = document.createElement("li");
      const label = document.createElement("span");
      label.className = "class";
      label.textContent = cls;
      const count = document.createElement("span");
      count.className = "count";
      count.dataset.stat = JSON.stringify(["pools", name, "errors", cls]);
      count.title = EXPLAIN.errors;
      count.textContent = format(errors[cls]);
      li.append(label, " ", count);
      list.append(li);
    }
  }

  function renderQueue(history, now) {
    const svg = $("queue-chart");
    const samples = Array.isArray(history) ? history : [];
    const points = [];
    for (const sample of samples) {
      const at = Date.parse(sample[0]);
      if (!Number.isNaN(at) && typeof sample[1] === "number") points.push([at, sample[1]]);
    }
    const peak = points.reduce((m, p) => Math.max(m, p[1]), 0);
    const end = points.length ? points[points.length - 1][0] : Date.now();
    // The axis spans the history there is (at least 2 min), up to the full 15 minutes.
    const covered = points.length ? (end - points[0][0]) / 1000 : 0;
    const spanMs = Math.min(WINDOW_S, Math.max(MIN_SPAN_S, Math.ceil(covered / 60) * 60)) * 1000;
    const start = end - spanMs;
    const yMax = Math.max(1, peak);
    const x = (t) => (((t - start) / spanMs) * 300).toFixed(1);
    const y = (n) => (76 - (n / yMax) * 70).toFixed(1);
    let line = "";
    for (const [at, n] of points) {
      line += (line ? " L" : "M") + x(at) + " " + y(n);
    }
    svg.querySelector(".line").setAttribute("d", line);
    svg.querySelector(".area").setAttribute(
      "d",
      points.length ? `${line} L${x(end)} 76 L${x(points[0][0])} 76 Z` : ""
    );
    svg.dataset.peak = String(peak);
    svg.dataset.points = String(points.length);
    $("queue-ymax").textContent = `peak ${peak}`;
    const spanMin = Math.round(spanMs / 60000);
    $("queue-span").textContent = `−${spanMin} min`;
    // The caption names the span the axis shows (it grows to 15 minutes as history comes).
    let caption = `Queue length over the last ${spanMin} minutes: `;
    if (!points.length) {
      caption += "no samples yet.";
    } else {
      const peakAt = points.find((p) => p[1] === peak)[0];
      const minutes = Math.max(1, Math.round((end - points[0][0]) / 60000));
      caption +=
        `now ${format(now)} waiting; peak ${peak}` +
        (peak ? ` at ${utc(peakAt).slice(11)}` : "") +
        `; ${points.length} samples over about ${minutes} min.`;
    }
    $("queue-caption").textContent = caption;
    renderQueueTable(points);
  }

  function renderQueueTable(points) {
    const minutes = new Map();
    for (const [at, n] of points) {
      const minute = new Date(at).toISOString().slice(11, 16);
      const row = minutes.get(minute) || { peak: 0, last: 0 };
      row.peak = Math.max(row.peak, n);
      row.last = n;
      minutes.set(minute, row);
    }
    const body = $("queue-table");
    body.replaceChildren();
    for (const [minute, row] of minutes) {
      const tr = document.createElement("tr");
      for (const text of [minute, String(row.peak), String(row.last)]) {
        const td = document.createElement("td");
        td.textContent = text;
        tr.append(td);
      }
      body.append(tr);
    }
  }

  // -- API keys' usage ------------------------------------------------------------------
  function cell(text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    return td;
  }

  function errorsText(errors) {
    const parts = Object.keys(errors || {}).sort().map((k) => `${k} ${errors[k]}`);
    return parts.length ? parts.join(", ") : "none";
  }

  function renderUsage(data, keys) {
    const hours = Array.isArray(data.hours) ? data.hours : [];
    const records = new Map((Array.isArray(keys) ? keys : []).map((k) => [String(k.id), k]));
    const byKey = new Map();
    for (const row of hours) {
      const id = String(row.key_id);
      if (!byKey.has(id)) byKey.set(id, { name: String(row.key || id), rows: [] });
      byKey.get(id).rows.push(row);
    }
    const container = $("keys");
    container.replaceChildren();
    const end = Date.now();
    for (const [id, key] of [...byKey].sort((a, b) => a[1].name.localeCompare(b[1].name))) {
      const card = document.createElement("article");
      card.className = "card key";
      card.tabIndex = 0;
      card.dataset.key = key.name;
      const title = document.createElement("h3");
      title.id = `key-${id}-title`;
      title.textContent = KEYLESS[id] || key.name;
      const record = records.get(id);
      if (id in KEYLESS) {
        card.classList.add("keyless");
        title.title = "Calls made without an API key: metered, but not a key";
      } else if (record && record.revoked) {
        card.classList.add("revoked");
        card.dataset.revoked = "true";
        const badge = document.createElement("span");
        badge.className = "badge revoked";
        badge.textContent = "revoked";
        badge.title = `Revoked at ${utc(record.revoked_at)}: refused everywhere; its usage stays`;
        title.append(" ", badge);
      }
      card.setAttribute("aria-labelledby", title.id);
      const recent = key.rows.filter((r) => end - Date.parse(r.hour) <= DAY_MS);
      const calls = key.rows.reduce((n, r) => n + r.calls, 0);
      const spaceS = key.rows.reduce((n, r) => n + r.space_s, 0);
      card.dataset.calls = String(calls);
      const svg = document.createElementNS(SVG, "svg");
      svg.setAttribute("class", "key-chart");
      svg.setAttribute("viewBox", "0 0 240 60");
      svg.setAttribute("preserveAspectRatio", "none");
      svg.setAttribute("role", "img");
      svg.setAttribute("aria-label", `${key.name}: calls (bars) and Space-seconds (dashed line) per hour, last 24 hours`);
      // 24 hourly slots: calls as bars, Space-seconds as a dashed line over them.
      const slot = (iso) => Math.min(23, Math.max(0, Math.floor((Date.parse(iso) - (end - DAY_MS)) / 3600000)));
      const topCalls = Math.max(1, ...recent.map((r) => r.calls));
      const topSpace = Math.max(1e-9, ...recent.map((r) => r.space_s));
      let line = "";
      for (const r of [...recent].sort((a, b) => Date.parse(a.hour) - Date.parse(b.hour))) {
        const bar = document.createElementNS(SVG, "rect");
        const height = Math.max(1, (r.calls / topCalls) * 54);
        bar.setAttribute("class", "calls");
        bar.setAttribute("x", String(slot(r.hour) * 10 + 0.5));
        bar.setAttribute("width", "9");
        bar.setAttribute("y", (58 - height).toFixed(1));
        bar.setAttribute("height", height.toFixed(1));
        svg.append(bar);
        const y = (58 - (r.space_s / topSpace) * 54).toFixed(1);
        line += `${line ? " L" : "M"}${slot(r.hour) * 10} ${y} L${slot(r.hour) * 10 + 10} ${y}`;
      }
      const path = document.createElementNS(SVG, "path");
      path.setAttribute("class", "space");
      path.setAttribute("d", line);
      svg.append(path);
      svg.dataset.points = String(recent.length);
      const fine = document.createElement("p");
      fine.className = "fine";
      const errors = {};
      for (const r of key.rows) for (const [k, v] of Object.entries(r.errors || {})) errors[k] = (errors[k] || 0) + v;
      fine.textContent = `${calls} calls · ${spaceS.toFixed(1)} Space-s · errors: ${errorsText(errors)} (7 days)`;
      card.append(title, svg, fine);
      container.append(card);
    }
    // Keys only: the keyless meters ("no key", the shared token) are not keys.
    const real = [...byKey.keys()].filter((id) => !(id in KEYLESS));
    const revoked = real.filter((id) => records.get(id) && records.get(id).revoked).length;
    $("key-count").textContent =
      `(${real.length} key${real.length === 1 ? "" : "s"}` + (revoked ? `, ${revoked} revoked)` : ")");
    const body = $("top-users");
    body.replaceChildren();
    for (const u of (Array.isArray(data.users) ? data.users : []).slice(0, 10)) {
      const tr = document.createElement("tr");
      tr.append(cell(String(u.key || u.key_id)), cell(String(u.user), "user"), cell(String(u.calls)),
                cell(errorsText(u.errors)), cell(Number(u.space_s).toFixed(1)), cell(Number(u.wait_s).toFixed(1)));
      body.append(tr);
    }
  }

  async function pollUsage(bearer, mine) {
    if (Date.now() - usageAt < USAGE_MS) return;
    usageAt = Date.now();
    try {
      const response = await fetch(USAGE_URL, {
        headers: { Authorization: "Bearer " + bearer, Accept: "application/json" },
        cache: "no-store",
        credentials: "omit",
        referrerPolicy: "no-referrer",
      });
      if (!response.ok || mine !== generation) return;
      const data = await response.json();
      let keys = [];
      const listed = await fetch(KEYS_URL, {
        headers: { Authorization: "Bearer " + bearer, Accept: "application/json" },
        cache: "no-store",
        credentials: "omit",
        referrerPolicy: "no-referrer",
      });
      if (listed.ok) keys = (await listed.json()).keys;
      if (mine === generation) renderUsage(data, keys);
    } catch (e) {
      /* the next round tries again */
    }
  }

  function clearDashboard() {
    $("keys").replaceChildren();
    $("top-users").replaceChildren();
    $("key-count").textContent = "";
    usageAt = 0;
    $("spaces").replaceChildren();
    $("space-count").textContent = "";
    for (const el of document.querySelectorAll("#dashboard [data-stat]")) fill(el, undefined);
    renderQueue([], undefined);
    setBar($("cap-bar"), 0, 0, undefined, "Global cap in use");
    lastHealth = null;
    $("health-age").textContent = "";
    lastOk = 0;
    failure = "";
  }

  // -- status ---------------------------------------------------------------------------
  function setStatus(state, text) {
    const status = $("status");
    if (status.dataset.state !== state || status.textContent !== text) {
      status.dataset.state = state;
      status.textContent = text;
    }
    document.body.dataset.state = state;
  }

  function tickAges() {
    const next = nextHealth ? ` · next at ${utc(nextHealth).slice(11)}` : "";
    if (lastHealth) {
      const age = Math.max(0, Math.round((Date.now() - Date.parse(lastHealth)) / 1000));
      $("health-age").textContent = Number.isNaN(age) ? next : `(${age} s ago)${next}`;
    } else {
      $("health-age").textContent = nextHealth ? `none yet${next}` : "";
    }
    if (!lastOk || $("dashboard").hidden) return;
    const age = Date.now() - lastOk;
    const stale = failure !== "" || age > STALE_MS;
    const banner = $("stale-banner");
    if (stale) {
      setStatus("stale", `Stale: last update at ${lastOkText}`);
      $("stale-age").textContent = String(Math.round(age / 1000));
      $("stale-at").textContent = lastOkText;
      $("stale-reason").textContent = failure ? `(${failure})` : "";
      banner.hidden = false;
    } else {
      setStatus("live", `Live · updated ${lastOkText}`);
      banner.hidden = true;
    }
  }

  // -- polling ----------------------------------------------------------------------------
  async function poll() {
    const mine = generation;
    const bearer = currentToken();
    if (!bearer) return;
    const controller = new AbortController();
    const abort = setTimeout(() => controller.abort(), TIMEOUT_MS);
    try {
      const response = await fetch(STATS_URL, {
        headers: { Authorization: "Bearer " + bearer, Accept: "application/json" },
        cache: "no-store",
        credentials: "omit",
        referrerPolicy: "no-referrer",
        signal: controller.signal,
      });
      if (mine !== generation) return;
      if (response.status === 401) {
        forget("The server refused this token (401). Enter the admin token again.");
        return;
      }
      if (response.status === 403) {
        forget("Admin access is switched off on this server (POOL_ADMIN_TOKEN is not set).");
        return;
      }
      if (!response.ok) throw new Error(`the server answered ${response.status}`);
      const data = await response.json();
      if (mine !== generation) return;
      $("login").hidden = true;
      $("dashboard").hidden = false;
      $("forget").hidden = false;
      render(data);
      pollUsage(bearer, mine);
      lastOk = Date.now();
      lastOkText = utc(new Date(lastOk).toISOString()).slice(11);
      failure = "";
    } catch (e) {
      if (mine !== generation) return;
      failure = e && e.name === "AbortError" ? "the request timed out" : "the request failed";
      if (!lastOk) setStatus("stale", "Cannot reach the server: " + failure);
    } finally {
      clearTimeout(abort);
      if (mine === generation) {
        tickAges();
        timer = setTimeout(poll, POLL_MS);
      }
    }
  }

  function start() {
    generation += 1;
    clearTimeout(timer);
    setStatus("connecting", "Connecting…");
    poll();
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const input = $("token");
      const value = input.value.trim();
      input.value = "";
      if (!value) return;
      storeToken(value);
      $("login-error").hidden = true;
      start();
    });
    $("forget").addEventListener("click", () => forget(""));
    setInterval(tickAges, 1000);
    if (currentToken()) start();
    else $("token").focus();
  });
})();
