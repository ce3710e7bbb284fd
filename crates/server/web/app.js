// The chat and cluster page of `shardlm serve`. Plain browser JavaScript, no
// build step. Conversations, settings and the API key live in localStorage.
// Chat streams from POST /v1/chat/completions (SSE, with
// stream_options.include_usage for the token counts); the cluster panel polls
// GET /cluster (docs/WEB.md).
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const md = window.ShardMd;
  const KEY_CONV = "shardlm.conversations";
  const KEY_SETTINGS = "shardlm.settings";
  const KEY_API = "shardlm.apiKey";

  const load = (k, d) => {
    try {
      const v = JSON.parse(localStorage.getItem(k));
      return v == null ? d : v;
    } catch (_) {
      return d;
    }
  };
  const save = (k, v) => localStorage.setItem(k, JSON.stringify(v));

  let conversations = load(KEY_CONV, []);
  let settings = Object.assign({ system: "", temperature: 0.7, top_p: 1, max_tokens: "" }, load(KEY_SETTINGS, {}));
  let currentId = conversations.length ? conversations[0].id : null;
  let controller = null; // AbortController of the streaming reply
  let modelName = "default";

  // --- API key ------------------------------------------------------------
  function apiKey() {
    return localStorage.getItem(KEY_API) || "";
  }
  function headers() {
    const h = { "Content-Type": "application/json" };
    if (apiKey()) h.Authorization = "Bearer " + apiKey();
    return h;
  }
  function askKey() {
    $("key-dialog").hidden = false;
    $("key-input").value = apiKey();
    $("key-input").focus();
  }
  $("key-button").onclick = () => ($("key-dialog").hidden ? askKey() : ($("key-dialog").hidden = true));
  $("key-form").onsubmit = (e) => {
    e.preventDefault();
    localStorage.setItem(KEY_API, $("key-input").value.trim());
    $("key-dialog").hidden = true;
    showError("");
    refreshModel();
    pollCluster();
  };
  $("key-clear").onclick = () => {
    localStorage.removeItem(KEY_API);
    $("key-input").value = "";
  };

  function showError(text) {
    $("error").textContent = text;
    $("error").hidden = !text;
  }

  async function refreshModel() {
    try {
      const r = await fetch("/v1/models", { headers: headers() });
      if (r.status === 401) return askKey();
      const j = await r.json();
      if (j.data && j.data[0]) {
        modelName = j.data[0].id;
        $("model-name").textContent = modelName;
      }
    } catch (_) {}
  }

  // --- conversations -------------------------------------------------------
  function current() {
    return conversations.find((c) => c.id === currentId);
  }
  function newConversation() {
    const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "New chat", messages: [] };
    conversations.unshift(c);
    currentId = c.id;
    persist();
    renderAll();
    $("input").focus();
    return c;
  }
  function persist() {
    save(KEY_CONV, conversations);
  }
  function renderConversations() {
    const ul = $("conversations");
    ul.textContent = "";
    for (const c of conversations) {
      const li = document.createElement("li");
      li.dataset.role = "conversation";
      li.className = c.id === currentId ? "active" : "";
      const t = document.createElement("span");
      t.textContent = c.title;
      li.appendChild(t);
      const del = document.createElement("button");
      del.textContent = "×";
      del.title = "Delete";
      del.onclick = (e) => {
        e.stopPropagation();
        conversations = conversations.filter((x) => x.id !== c.id);
        if (currentId === c.id) currentId = conversations.length ? conversations[0].id : null;
        persist();
        renderAll();
      };
      li.appendChild(del);
      li.onclick = () => {
        if (controller) return;
        currentId = c.id;
        renderAll();
      };
      ul.appendChild(li);
    }
  }

  // --- messages --------------------------------------------------------------
  function fmtStats(s) {
    if (!s) return "";
    const parts = [];
    if (s.ttft_ms != null) parts.push("TTFT " + (s.ttft_ms / 1000).toFixed(2) + " s");
    if (s.tok_s != null) parts.push(s.tok_s.toFixed(1) + " tok/s");
    if (s.completion_tokens != null) parts.push(s.completion_tokens + " tokens");
    if (s.prompt_tokens != null) parts.push("prompt " + s.prompt_tokens + (s.cached_tokens != null ? " (" + s.cached_tokens + " from cache)" : ""));
    if (s.finish) parts.push(s.finish);
    return parts.join(" · ");
  }

  function messageNode(m, index) {
    const div = document.createElement("div");
    div.className = "msg " + m.role;
    div.dataset.role = m.role === "assistant" ? "message-assistant" : "message-user";
    const who = document.createElement("div");
    who.className = "who";
    const name = document.createElement("span");
    name.textContent = m.role === "user" ? "You" : "Assistant";
    who.appendChild(name);
    if (m.role === "user") {
      const edit = document.createElement("button");
      edit.textContent = "Edit";
      edit.dataset.role = "edit";
      edit.onclick = () => startEdit(div, index);
      who.appendChild(edit);
    }
    div.appendChild(who);
    if (m.role === "assistant") {
      const det = document.createElement("details");
      det.className = "reasoning";
      det.dataset.role = "reasoning";
      det.innerHTML = "<summary>Reasoning</summary>";
      const rt = document.createElement("div");
      rt.className = "text";
      det.appendChild(rt);
      div.appendChild(det);
    }
    const body = document.createElement("div");
    body.className = "body";
    div.appendChild(body);
    const stats = document.createElement("div");
    stats.className = "stats";
    stats.dataset.role = "message-stats";
    div.appendChild(stats);
    fillMessage(div, m);
    return div;
  }

  function fillMessage(div, m) {
    const body = div.querySelector(".body");
    if (m.role === "assistant") {
      body.innerHTML = md.render(m.content || "");
      const det = div.querySelector("details.reasoning");
      det.hidden = !m.reasoning;
      det.querySelector(".text").textContent = m.reasoning || "";
      if (m.done) div.dataset.done = "true";
    } else {
      body.textContent = m.content;
    }
    div.querySelector(".stats").textContent = fmtStats(m.stats) + (m.error ? "  error: " + m.error : "");
  }

  function renderMessages() {
    const box = $("messages");
    box.textContent = "";
    const c = current();
    if (!c) return;
    c.messages.forEach((m, i) => box.appendChild(messageNode(m, i)));
    box.scrollTop = box.scrollHeight;
  }

  function renderAll() {
    renderConversations();
    renderMessages();
    const busy = !!controller;
    $("send").hidden = busy;
    $("stop").hidden = !busy;
    $("regen").disabled = busy || !(current() && current().messages.some((m) => m.role === "assistant"));
  }

  function startEdit(div, index) {
    if (controller) return;
    const c = current();
    const body = div.querySelector(".body");
    const ta = document.createElement("textarea");
    ta.className = "edit";
    ta.dataset.role = "edit-input";
    ta.value = c.messages[index].content;
    ta.rows = 3;
    const ok = document.createElement("button");
    ok.textContent = "Save and resend";
    ok.dataset.role = "edit-save";
    ok.onclick = () => {
      c.messages = c.messages.slice(0, index);
      c.messages.push({ role: "user", content: ta.value });
      if (index === 0) c.title = ta.value.slice(0, 40) || "New chat";
      persist();
      generate(c);
    };
    body.replaceWith(ta);
    ta.after(ok);
    ta.focus();
  }

  // --- settings ----------------------------------------------------------------
  for (const k of ["system", "temperature", "top_p", "max_tokens"]) {
    $(k).value = settings[k];
    $(k).oninput = () => {
      settings[k] = $(k).value;
      save(KEY_SETTINGS, settings);
    };
  }

  // --- streaming ---------------------------------------------------------------
  // Splits `<think>…</think>` written into the content (templates whose
  // reasoning the server does not separate) into the reasoning.
  function splitThink(text) {
    const m = /^\s*<think>([\s\S]*?)(<\/think>|$)([\s\S]*)$/.exec(text);
    return m ? { reasoning: m[1], content: m[3] } : { reasoning: "", content: text };
  }

  // Parses the SSE `data:` lines of `chunk` (text), keeping a partial last line in `state.rest`.
  function sseEvents(state, chunk) {
    state.rest += chunk;
    const out = [];
    let nl;
    while ((nl = state.rest.indexOf("\n")) >= 0) {
      const line = state.rest.slice(0, nl).replace(/\r$/, "");
      state.rest = state.rest.slice(nl + 1);
      if (line.startsWith("data:")) out.push(line.slice(5).trim());
    }
    return out;
  }

  async function generate(c) {
    const msgs = [];
    if (settings.system.trim()) msgs.push({ role: "system", content: settings.system });
    // Replies that were stopped before any text, or failed, are not sent back.
    for (const m of c.messages) if (m.role === "user" || m.content) msgs.push({ role: m.role, content: m.content });
    const reply = { role: "assistant", content: "", reasoning: "", stats: {}, done: false };
    c.messages.push(reply);
    if (c.title === "New chat") {
      const first = c.messages.find((m) => m.role === "user");
      if (first) c.title = first.content.slice(0, 40) || "New chat";
    }
    controller = new AbortController();
    renderAll();
    showError("");
    const node = $("messages").lastChild;
    const body = {
      model: modelName,
      messages: msgs,
      stream: true,
      stream_options: { include_usage: true },
    };
    const t = parseFloat(settings.temperature);
    if (!isNaN(t)) body.temperature = t;
    const p = parseFloat(settings.top_p);
    if (!isNaN(p)) body.top_p = p;
    const mt = parseInt(settings.max_tokens, 10);
    if (!isNaN(mt) && mt > 0) body.max_tokens = mt;
    const t0 = performance.now();
    let tFirst = null;
    let raw = "";
    let pieces = 0;
    let scheduled = false;
    const paint = () => {
      scheduled = false;
      fillMessage(node, reply);
      const box = $("messages");
      if (box.scrollHeight - box.scrollTop - box.clientHeight < 120) box.scrollTop = box.scrollHeight;
    };
    try {
      const r = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: headers(),
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (r.status === 401) {
        askKey();
        throw new Error("the server needs an API key");
      }
      if (!r.ok) {
        let msg = r.status + " " + r.statusText;
        try {
          msg = (await r.json()).error.message || msg;
        } catch (_) {}
        throw new Error(msg);
      }
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      const sse = { rest: "" };
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        for (const data of sseEvents(sse, dec.decode(value, { stream: true }))) {
          if (data === "[DONE]") continue;
          let j;
          try {
            j = JSON.parse(data);
          } catch (_) {
            continue;
          }
          if (j.error) throw new Error(j.error.message || "error");
          const ch = j.choices && j.choices[0];
          if (ch && ch.delta) {
            const d = ch.delta;
            if (d.content || d.reasoning_content) {
              if (tFirst == null) tFirst = performance.now();
              pieces++;
            }
            if (d.reasoning_content) reply.reasoningApi = (reply.reasoningApi || "") + d.reasoning_content;
            if (d.content) raw += d.content;
            const s = splitThink(raw);
            reply.content = s.content;
            reply.reasoning = (reply.reasoningApi || "") + s.reasoning;
          }
          if (ch && ch.finish_reason) reply.stats.finish = ch.finish_reason;
          if (j.usage) {
            reply.stats.prompt_tokens = j.usage.prompt_tokens;
            reply.stats.completion_tokens = j.usage.completion_tokens;
            const det = j.usage.prompt_tokens_details;
            reply.stats.cached_tokens = det && det.cached_tokens != null ? det.cached_tokens : null;
          }
          if (!scheduled) {
            scheduled = true;
            requestAnimationFrame(paint);
          }
        }
      }
    } catch (e) {
      if (e.name === "AbortError") reply.stats.finish = "stopped";
      else {
        reply.error = e.message;
        showError(e.message);
      }
    }
    const tEnd = performance.now();
    if (tFirst != null) {
      reply.stats.ttft_ms = tFirst - t0;
      const n = reply.stats.completion_tokens != null ? reply.stats.completion_tokens : pieces;
      // Tokens after the first over the time after it (as `bench` counts decode).
      if (n > 1 && tEnd > tFirst) reply.stats.tok_s = (n - 1) / ((tEnd - tFirst) / 1000);
    }
    delete reply.reasoningApi;
    reply.done = true;
    controller = null;
    persist();
    renderAll();
  }

  $("composer").onsubmit = (e) => {
    e.preventDefault();
    if (controller) return;
    const text = $("input").value;
    if (!text.trim()) return;
    const c = current() || newConversation();
    c.messages.push({ role: "user", content: text });
    $("input").value = "";
    persist();
    generate(c);
  };
  $("input").onkeydown = (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  };
  $("stop").onclick = () => controller && controller.abort();
  $("regen").onclick = () => {
    const c = current();
    if (!c || controller) return;
    while (c.messages.length && c.messages[c.messages.length - 1].role === "assistant") c.messages.pop();
    if (c.messages.length) generate(c);
  };
  $("new-chat").onclick = () => !controller && newConversation();

  // --- cluster -------------------------------------------------------------------
  function bytes(n) {
    if (n == null) return "–";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) {
      n /= 1024;
      i++;
    }
    return n.toFixed(i ? 1 : 0) + " " + u[i];
  }
  function rate(bps) {
    return bps == null ? "–" : (bps * 8e-9).toFixed(2) + " Gbit/s";
  }
  function cell(tr, text, title) {
    const td = document.createElement("td");
    td.textContent = text;
    if (title) td.title = title;
    tr.appendChild(td);
    return td;
  }
  // "prefill 21.0 W · 0.052 J/token" (or why there is no figure yet).
  function phaseText(name, ph) {
    if (!ph || ph.mean_w == null) return name + " –";
    return name + " " + ph.mean_w.toFixed(1) + " W" + (ph.joules_per_token == null ? "" : " · " + ph.joules_per_token.toFixed(3) + " J/token");
  }
  // The cluster's power: each host once, and per phase over the hosts.
  function clusterPower(p) {
    const read = p.hosts.filter((h) => h.readable);
    if (!read.length) return "not readable on any host";
    const total = p.total_watts == null ? "sampling…" : p.total_watts.toFixed(1) + " W";
    const hosts = p.hosts.map((h) => h.host + " " + (h.readable ? (h.watts == null ? "…" : h.watts.toFixed(1) + " W") : "not readable")).join(", ");
    return total + " (" + hosts + ") · " + phaseText("prefill", p.prefill) + " · " + phaseText("decode", p.decode);
  }
  // A rank's power: live watts, then prefill and decode; ranks sharing a
  // host show the same machine, so only the one counted for it is bold.
  function powerCell(tr, p, ranks) {
    const td = document.createElement("td");
    td.dataset.role = "rank-power";
    if (!p.readable) {
      td.textContent = "not readable";
      td.title = p.reason;
      tr.appendChild(td);
      return;
    }
    td.title = p.sources.join(", ");
    const w = document.createElement("div");
    w.textContent = p.watts == null ? "waiting for a reading" : p.watts.toFixed(1) + " W";
    if (p.age_s != null && p.age_s > 3) w.textContent += " (" + p.age_s.toFixed(0) + " s ago)";
    if (!p.counted_for_host) {
      const other = ranks.find((o) => o.power.readable && o.power.counted_for_host && o.power.host === p.host);
      if (other) w.textContent += " (host " + p.host + ", as rank " + other.rank + ")";
    } else {
      w.style.fontWeight = "600";
    }
    const ph = document.createElement("div");
    ph.className = "muted";
    ph.dataset.role = "rank-power-phases";
    ph.textContent = phaseText("prefill", p.prefill) + "; " + phaseText("decode", p.decode);
    td.append(w, ph);
    tr.appendChild(td);
  }
  function renderCluster(j) {
    $("cluster-status").textContent = j.status + " · " + j.strategy + " · " + j.world_size + (j.world_size === 1 ? " rank" : " ranks");
    const kv = j.kv_pool;
    const pc = j.prefix_cache;
    const s = $("cluster-summary");
    s.textContent = "";
    const row = (k, v) => {
      const a = document.createElement("span");
      a.className = "muted";
      a.textContent = k;
      const b = document.createElement("span");
      b.textContent = v;
      s.append(a, b);
    };
    row("Model", j.model + " (context " + j.context + ")");
    row("KV pool", kv.blocks_used + " used · " + kv.blocks_cached + " cached · " + kv.blocks_free + " free of " + kv.blocks_total + " blocks × " + kv.block_tokens + " tokens");
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.style.gridColumn = "1 / 3";
    const tot = Math.max(kv.blocks_total, 1);
    for (const [cls, n] of [["used", kv.blocks_used], ["cached", kv.blocks_cached]]) {
      const d = document.createElement("div");
      d.className = cls;
      d.style.width = (100 * n) / tot + "%";
      bar.appendChild(d);
    }
    s.appendChild(bar);
    row("Prefix cache", pc.enabled ? (pc.hit_rate == null ? "no lookups yet" : (100 * pc.hit_rate).toFixed(0) + "% hits of " + pc.queries + " · " + pc.cached_tokens + " tokens reused") : "off");
    row("Queue", j.queue.waiting + " waiting · " + j.queue.active + " active · batch " + j.queue.batch_size);
    row("Throughput", j.throughput.tokens_per_s.toFixed(1) + " tok/s · " + j.throughput.generated_tokens_total + " generated");
    if (j.power) {
      row("Power", clusterPower(j.power));
      s.lastChild.dataset.role = "cluster-power";
    }
    const tb = $("rank-rows");
    tb.textContent = "";
    for (const r of j.ranks) {
      const tr = document.createElement("tr");
      tr.dataset.role = "rank";
      tr.dataset.rank = r.rank;
      if (r.degraded) tr.className = "degraded";
      cell(tr, r.rank + (r.degraded ? " (degraded)" : ""));
      cell(tr, r.host, "pid " + r.pid);
      cell(tr, r.role.label);
      cell(tr, r.layers[0] + "–" + r.layers[1] + " (" + (r.layers[1] - r.layers[0]) + ")").dataset.role = "rank-layers";
      const m = r.memory;
      cell(tr, "weights " + bytes(m.weights_bytes) + " · KV " + bytes(m.kv_used_bytes) + " / " + bytes(m.kv_pool_bytes) + " · RSS " + bytes(m.rss_bytes) + " of " + bytes(m.total_bytes)).dataset.role = "rank-memory";
      powerCell(tr, r.power, j.ranks);
      tb.appendChild(tr);
    }
    const unreadable = j.ranks.filter((r) => !r.power.readable);
    if (unreadable.length) {
      const tr = document.createElement("tr");
      const td = cell(tr, "Power: not readable on rank " + unreadable.map((r) => r.rank + " (" + r.power.reason + ")").join(", rank "));
      td.colSpan = 6;
      td.className = "muted";
      tb.appendChild(tr);
    }
    const links = $("links");
    links.textContent = "";
    if (!j.links.length) links.textContent = j.world_size > 1 ? "no link measurements" : "single process: no links";
    for (const l of j.links) {
      const div = document.createElement("div");
      div.dataset.role = "link";
      const cables = l.cables.length
        ? l.cables.map((c, i) => "cable " + i + " " + c.local + " → " + c.remote + ": " + rate(c.send_bytes_per_s) + " out, " + rate(c.recv_bytes_per_s) + " in, round trip " + (c.rtt_us == null ? "–" : c.rtt_us.toFixed(0) + " µs")).join("; ")
        : "not measured";
      div.textContent = "rank " + l.from + " ↔ " + l.to + " over " + l.transport + ": " + cables;
      links.appendChild(div);
    }
  }
  async function pollCluster() {
    try {
      const r = await fetch("/cluster", { headers: headers() });
      if (r.status === 401) {
        $("cluster-status").textContent = "needs the API key";
        return;
      }
      renderCluster(await r.json());
    } catch (e) {
      $("cluster-status").textContent = "unreachable (" + e.message + ")";
    }
  }

  renderAll();
  refreshModel();
  pollCluster();
  setInterval(pollCluster, 2000);
})();
