// The Twinkle console: one page over the gateway's JSON APIs, with the key the user typed.
// Every value from the server is put on the page as text (textContent), never as markup.
"use strict";

(function () {
  const KEY_STORE = "twinkle.console.key";
  // The page is served at <gateway>/console/: the gateway's routes are one level up.
  const ROOT = location.pathname.replace(/\/console(\/.*)?$/, "");
  const POLL_MS = 1000;
  const $ = (id) => document.getElementById(id);

  let me = null;
  let timer = null;
  let curve = { runId: null, points: [], lastStep: null };
  let checkpoint = null;
  let chat = [];

  // ------------------------------------------------------------------ HTTP
  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  function key() {
    return sessionStorage.getItem(KEY_STORE);
  }

  async function api(method, path, body) {
    const headers = { Authorization: "Bearer " + key() };
    const init = { method, headers };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path.startsWith("/") ? path : ROOT + "/" + path, init);
    const text = await response.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch (_) {
      data = text;
    }
    if (!response.ok) {
      throw new ApiError(response.status, errorMessage(data) || response.statusText);
    }
    return data;
  }

  function errorMessage(data) {
    if (!data || typeof data !== "object") return data ? String(data) : "";
    if (data.error && typeof data.error === "object") return data.error.message;
    if (typeof data.error === "string") return data.error;
    if (typeof data.detail === "string") return data.detail;
    if (data.detail) return JSON.stringify(data.detail);
    return data.message || "";
  }

  // ------------------------------------------------------------------ DOM
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (name === "text") node.textContent = value;
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value);
    }
    for (const child of children) {
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function fill(tbodyParent, rows, emptyId) {
    const body = tbodyParent.querySelector("tbody");
    body.replaceChildren(...rows);
    if (emptyId) $(emptyId).hidden = rows.length > 0;
  }

  function cells(values) {
    return values.map((v) => (v instanceof Node ? el("td", {}, v) : el("td", { text: v ?? "" })));
  }

  function when(value) {
    if (value === null || value === undefined || value === "") return "";
    const date = typeof value === "number" ? new Date(value * 1000) : new Date(value);
    return isNaN(date) ? String(value) : date.toLocaleString();
  }

  function bytes(n) {
    if (n === null || n === undefined) return "";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) {
      n /= 1024;
      i += 1;
    }
    return (i ? n.toFixed(1) : n) + " " + units[i];
  }

  function showError(message) {
    const box = $("error");
    box.textContent = message || "";
    box.hidden = !message;
  }

  // ------------------------------------------------------------------ login
  async function login(candidate) {
    sessionStorage.setItem(KEY_STORE, candidate);
    try {
      me = await api("GET", "console/api/me");
    } catch (err) {
      sessionStorage.removeItem(KEY_STORE);
      me = null;
      throw err;
    }
    $("who").textContent = "tenant " + me.tenant_id + (me.admin ? " (operator)" : "");
    $("nav").hidden = false;
    $("logout").hidden = false;
    $("nav-admin").hidden = !me.admin;
  }

  function logout() {
    sessionStorage.removeItem(KEY_STORE);
    me = null;
    $("nav").hidden = true;
    $("logout").hidden = true;
    $("who").textContent = "";
    location.hash = "";
    route();
  }

  // ------------------------------------------------------------------ pages
  function show(page) {
    for (const section of document.querySelectorAll("main > .page")) {
      section.hidden = section.id !== "page-" + page;
    }
    for (const link of document.querySelectorAll("#nav a")) {
      link.classList.toggle("active", link.dataset.page === page);
    }
  }

  function every(ms, fn) {
    stopTimer();
    const tick = async () => {
      try {
        await fn();
        showError("");
      } catch (err) {
        showError(err.message);
      }
    };
    tick();
    timer = setInterval(() => {
      if (!document.hidden) tick();
    }, ms);
  }

  function stopTimer() {
    if (timer !== null) clearInterval(timer);
    timer = null;
  }

  async function route() {
    stopTimer();
    showError("");
    if (!me) {
      show("login");
      return;
    }
    const hash = location.hash.replace(/^#\/?/, "");
    const [page, ...rest] = hash.split("/");
    const arg = rest.join("/");
    try {
      if (page === "run" && arg) await runPage(decodeURIComponent(arg));
      else if (page === "sessions") every(5000, sessionsPage);
      else if (page === "queue") every(2000, queuePage);
      else if (page === "playground") await playgroundPage(new URLSearchParams(arg).get("model"));
      else if (page === "admin" && me.admin) every(3000, adminPage);
      else every(5000, runsPage);
    } catch (err) {
      showError(err.message);
    }
  }

  async function runsPage() {
    show("runs");
    const data = await api("GET", "training_runs?limit=1000");
    const rows = data.training_runs.map((run) =>
      el(
        "tr",
        { class: "run-row", "data-run-id": run.training_run_id },
        ...cells([
          el("a", { href: "#/run/" + encodeURIComponent(run.training_run_id), text: run.training_run_id }),
          run.base_model,
          run.lora_rank,
          run.status,
          when(run.last_request_time),
          run.last_checkpoint ? run.last_checkpoint.checkpoint_id : "",
        ])
      )
    );
    fill($("runs-table"), rows, "runs-empty");
  }

  async function sessionsPage() {
    show("sessions");
    const data = await api("GET", "console/api/sessions");
    const rows = data.sessions.map((s) => {
      const runs = el("span");
      for (const id of s.training_run_ids) {
        runs.append(el("a", { href: "#/run/" + encodeURIComponent(id), text: id }), " ");
      }
      return el(
        "tr",
        { class: "session-row" },
        ...cells([s.session_id, when(s.created_at), when(s.last_heartbeat),
          s.finished ? "finished" : "active", runs])
      );
    });
    fill($("sessions-table"), rows, "sessions-empty");
  }

  async function queuePage() {
    show("queue");
    const data = await api("GET", "console/api/queue");
    fill(
      $("pending-table"),
      data.pending.map((c) =>
        el("tr", { class: "pending-row" }, ...cells([c.request_id, c.kind, c.model,
          c.position + " of " + c.of, c.waiting_s.toFixed(1) + " s"]))
      ),
      "pending-empty"
    );
    const rows = [];
    for (const [model, status] of await modelStatuses()) {
      const mine = status.tenants.length ? status.tenants : [{}];
      for (const a of mine) {
        rows.push(el("tr", { class: "model-queue-row" }, ...cells([model, a.adapter_name,
          a.training_run_id, a.steps, a.last_loss == null ? "" : a.last_loss.toFixed(4),
          a.queue_depth, status.queue_depth])));
      }
    }
    fill($("model-queue-table"), rows);
  }

  async function modelStatuses() {
    const table = await api("GET", "routes");
    const found = [];
    for (const [model, prefix] of Object.entries(table.models || {})) {
      found.push([model, await api("GET", prefix + "/status")]);
    }
    return found;
  }

  async function adminPage() {
    show("admin");
    const data = await api("GET", "console/api/admin");
    const statuses = new Map(await modelStatuses());
    fill(
      $("capacity-table"),
      Object.entries(data.capacity).map(([model, c]) => {
        const s = statuses.get(model) || {};
        return el("tr", { class: "capacity-row" }, ...cells([model, c.max_loras, c.used_loras,
          c.free_loras, s.queue_depth, s.fused_passes, s.busy_s, s.rate_limit_rejections]));
      })
    );
    const steps = data.tenants.reduce((sum, t) => sum + t.steps, 0);
    fill(
      $("tenants-table"),
      data.tenants.map((t) =>
        el("tr", { class: "tenant-row", "data-tenant": t.tenant_id }, ...cells([t.tenant_id,
          t.active_sessions, t.runs, t.loaded_adapters, t.pending_calls, t.steps,
          steps ? ((100 * t.steps) / steps).toFixed(0) + " %" : ""]))
      )
    );
    fill(
      $("adapters-table"),
      data.adapters.map((a) =>
        el("tr", { class: "adapter-row" }, ...cells([a.tenant_id, a.training_run_id,
          a.base_model, a.adapter_name, a.lora_rank, when(a.last_request_time)]))
      )
    );
  }

  // ------------------------------------------------------------------ run + curve
  async function runPage(runId) {
    show("run");
    $("run-id").textContent = runId;
    $("checkpoint-detail").hidden = true;
    const run = await api("GET", "training_runs/" + encodeURIComponent(runId));
    $("run-facts").textContent = `${run.base_model}, LoRA rank ${run.lora_rank}, ${run.status}`;
    curve = { runId, points: [], lastStep: null };
    drawCurve();
    await loadCheckpoints(runId);
    let tick = 0;
    every(POLL_MS, async () => {
      await pollHistory(runId);
      tick += 1;
      if (tick % 5 === 0) await loadCheckpoints(runId);
    });
  }

  async function pollHistory(runId) {
    const since = curve.lastStep === null ? "" : "?since_step=" + curve.lastStep;
    const history = await api("GET", `training_runs/${encodeURIComponent(runId)}/history${since}`);
    if (curve.runId !== runId) return;
    const fresh = history.points.filter((p) => curve.lastStep === null || p.step > curve.lastStep);
    if (fresh.length) {
      curve.points.push(...fresh);
      curve.lastStep = curve.points[curve.points.length - 1].step;
      drawCurve();
    }
    $("curve-status").textContent =
      `${history.recorded} steps recorded` + (history.thinned ? " (older ones thinned)" : "");
  }

  function drawCurve() {
    const svg = $("curve");
    const metric = $("metric").value;
    const points = curve.points
      .filter((p) => typeof p[metric] === "number" && isFinite(p[metric]))
      .map((p) => [p.step, p[metric]]);
    const ns = "http://www.w3.org/2000/svg";
    const make = (tag, attrs, text) => {
      const node = document.createElementNS(ns, tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
      if (text !== undefined) node.textContent = text;
      return node;
    };
    const W = 720, H = 300, L = 60, R = 16, T = 14, B = 36;
    svg.replaceChildren();
    svg.setAttribute("data-points", String(points.length));
    svg.append(make("rect", { x: L, y: T, width: W - L - R, height: H - T - B, class: "plot" }));
    if (!points.length) {
      svg.append(make("text", { x: W / 2, y: H / 2, class: "empty", "text-anchor": "middle" },
        "waiting for the first optimizer step"));
      return;
    }
    let [x0, x1] = [points[0][0], points[points.length - 1][0]];
    let y0 = Math.min(...points.map((p) => p[1]));
    let y1 = Math.max(...points.map((p) => p[1]));
    if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
    if (y0 === y1) [y0, y1] = [y0 - Math.abs(y0 || 1) * 0.1, y1 + Math.abs(y1 || 1) * 0.1];
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
    for (let i = 0; i <= 4; i += 1) {
      const y = y0 + ((y1 - y0) * i) / 4;
      svg.append(make("line", { x1: L, x2: W - R, y1: sy(y), y2: sy(y), class: "grid" }));
      svg.append(make("text", { x: L - 6, y: sy(y) + 4, "text-anchor": "end" }, tick(y)));
      const x = x0 + ((x1 - x0) * i) / 4;
      svg.append(make("text", { x: sx(x), y: H - B + 16, "text-anchor": "middle" }, tick(x)));
    }
    svg.append(make("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle" }, "step"));
    svg.append(make("polyline", {
      class: "line",
      points: points.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" "),
    }));
    for (const [x, y] of points) {
      const dot = make("circle", { class: "point", cx: sx(x), cy: sy(y), r: 3 });
      dot.append(make("title", {}, `step ${x}: ${y}`));
      svg.append(dot);
    }
  }

  function tick(v) {
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(1);
    return Number.isInteger(v) ? String(v) : v.toPrecision(3);
  }

  async function loadCheckpoints(runId) {
    const data = await api("GET", `training_runs/${encodeURIComponent(runId)}/checkpoints`);
    if (curve.runId !== runId) return;
    const rows = data.checkpoints.map((c) =>
      el(
        "tr",
        { class: "ckpt-row", "data-path": c.twinkle_path },
        ...cells([c.checkpoint_id.split("/").slice(1).join("/"), c.checkpoint_type, when(c.time),
          bytes(c.size_bytes), c.expires_at ? when(c.expires_at) : "never", c.public ? "yes" : "no",
          el("button", { type: "button", class: "open", text: "Open",
            onclick: () => openCheckpoint(c) })])
      )
    );
    fill($("checkpoints"), rows, "checkpoints-empty");
  }

  async function openCheckpoint(c) {
    checkpoint = c;
    $("checkpoint-detail").hidden = false;
    $("ckpt-path").textContent = c.twinkle_path;
    $("ckpt-output").replaceChildren();
    const info = await api("GET", "checkpoint_info?twinkle_path=" + encodeURIComponent(c.twinkle_path));
    const facts = [
      ["Type", info.checkpoint_type],
      ["Base model", info.base_model],
      ["LoRA rank", info.lora_rank],
      ["Saved", when(c.time)],
      ["Size", bytes(c.size_bytes)],
      ["Expires", c.expires_at ? when(c.expires_at) : "never"],
      ["Public", c.public ? "yes" : "no"],
    ];
    $("ckpt-info").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v ?? "" })]));
    $("checkpoint-detail").scrollIntoView({ block: "nearest" });
  }

  function checkpointRoute(suffix) {
    const [kind, ...name] = checkpoint.checkpoint_id.split("/");
    const run = encodeURIComponent(checkpoint.twinkle_path.replace(/^twinkle:\/\//, "").split("/")[0]);
    return `training_runs/${run}/checkpoints/${kind}/${encodeURIComponent(name.join("/"))}${suffix}`;
  }

  function output(...nodes) {
    $("ckpt-output").replaceChildren(...nodes);
  }

  async function guarded(fn) {
    try {
      await fn();
    } catch (err) {
      output(el("span", { class: "error", text: err.message }));
    }
  }

  function wireCheckpointActions() {
    $("ckpt-set-ttl").addEventListener("click", () => guarded(async () => {
      const raw = $("ckpt-ttl").value;
      const updated = await api("PUT", checkpointRoute("/ttl"), { ttl_seconds: raw ? Number(raw) : null });
      output("Expires: " + (updated.expires_at ? when(updated.expires_at) : "never"));
      await loadCheckpoints(curve.runId);
    }));
    $("ckpt-download").addEventListener("click", () => guarded(async () => {
      const link = await api("GET", checkpointRoute("/archive"));
      output(el("a", { href: link.url, class: "download", text: "Download the archive" }),
        " (link valid until " + when(link.expires) + ")");
      location.assign(link.url);
    }));
    $("ckpt-export").addEventListener("click", () => guarded(async () => {
      let status = await api("POST", "merged_exports", { twinkle_path: checkpoint.twinkle_path });
      output("Merging into the base model...");
      while (status.status === "building") {
        await new Promise((resolve) => setTimeout(resolve, 1000));
        status = await api("GET", "merged_exports/" + encodeURIComponent(status.export_id));
      }
      if (status.status !== "ready") throw new Error(status.error || "export " + status.status);
      const list = el("ul");
      for (const [name, url] of Object.entries(status.files || {})) {
        list.append(el("li", {}, el("a", { href: url, text: name })));
      }
      output("Merged model ready:", list);
    }));
    $("ckpt-publish").addEventListener("click", () => guarded(async () => {
      const done = await api("POST", checkpointRoute("/publish"));
      output("Published as " + done.repo_id);
      await loadCheckpoints(curve.runId);
    }));
    $("ckpt-chat").addEventListener("click", () => {
      location.hash = "#/playground/model=" + encodeURIComponent(checkpoint.twinkle_path);
    });
    $("ckpt-delete").addEventListener("click", () => guarded(async () => {
      if (!confirm("Delete " + checkpoint.twinkle_path + "?")) return;
      await api("DELETE", checkpointRoute(""));
      $("checkpoint-detail").hidden = true;
      await loadCheckpoints(curve.runId);
    }));
  }

  // ------------------------------------------------------------------ playground
  async function playgroundPage(wanted) {
    show("playground");
    const models = await api("GET", "openai/v1/models");
    const select = $("pg-model");
    const current = wanted || select.value;
    select.replaceChildren(
      ...models.data.map((m) => {
        const label = m.owned_by === "you" ? m.id : m.id + " (base model)";
        return el("option", { value: m.id, text: label });
      })
    );
    if (current && models.data.some((m) => m.id === current)) select.value = current;
  }

  function renderChat() {
    $("pg-transcript").replaceChildren(
      ...chat.map((m) => el("div", { class: "msg " + m.role }, el("b", { text: m.role }), el("span", { text: m.content })))
    );
  }

  async function send(event) {
    event.preventDefault();
    const text = $("pg-input").value.trim();
    if (!text) return;
    $("pg-error").hidden = true;
    chat.push({ role: "user", content: text });
    $("pg-input").value = "";
    renderChat();
    $("pg-send").disabled = true;
    try {
      const reply = await api("POST", "openai/v1/chat/completions", {
        model: $("pg-model").value,
        messages: chat,
        max_tokens: Number($("pg-max-tokens").value) || 32,
        temperature: Number($("pg-temperature").value),
      });
      chat.push({ role: "assistant", content: reply.choices[0].message.content });
      renderChat();
    } catch (err) {
      chat.pop();
      renderChat();
      $("pg-error").textContent = err.message;
      $("pg-error").hidden = false;
    } finally {
      $("pg-send").disabled = false;
    }
  }

  // ------------------------------------------------------------------ start
  async function start() {
    $("login").addEventListener("submit", async (event) => {
      event.preventDefault();
      $("login-error").hidden = true;
      try {
        await login($("api-key").value.trim());
        $("api-key").value = "";
        if (!location.hash || location.hash === "#") location.hash = "#/runs";
        else route();
      } catch (err) {
        $("login-error").textContent = err.status === 401 ? "This key is not accepted." : err.message;
        $("login-error").hidden = false;
      }
    });
    $("logout").addEventListener("click", logout);
    $("metric").addEventListener("change", drawCurve);
    $("pg-form").addEventListener("submit", send);
    $("pg-clear").addEventListener("click", () => {
      chat = [];
      renderChat();
    });
    wireCheckpointActions();
    window.addEventListener("hashchange", route);
    if (key()) {
      try {
        await login(key());
      } catch (_) {
        // A key that stopped working: back to the login form.
      }
    }
    route();
  }

  start();
})();
