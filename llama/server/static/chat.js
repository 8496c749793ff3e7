// The chat page of `ggmlpy serve` (llama/server/webui.py): conversations streamed through this
// server's POST /v1/chat/completions, kept in localStorage. Plain JavaScript, no dependency and
// no request beyond this origin. Model text is only ever set as textContent, never as HTML.
"use strict";
(() => {
  const KEYS = {conversations: "ggmlpy.chat.conversations", current: "ggmlpy.chat.current",
                settings: "ggmlpy.chat.settings"};
  const NUMBERS = ["temperature", "top_p", "top_k", "min_p", "max_tokens", "seed"];
  const TEXTS = ["system", "tools", "tool_choice", "api-key"];
  const $ = (id) => document.getElementById(id);

  // --- storage --------------------------------------------------------------------------
  // A conversation: {id, title, messages}; a message: {role, content} and, from the model,
  // reasoning, toolCalls [{id, name, arguments}] and state (streaming, done, stopped, error).

  function load(key, fallback) {
    try {
      const text = localStorage.getItem(key);
      return text === null ? fallback : JSON.parse(text);
    } catch {
      return fallback;   // unreadable (another page's format): start afresh
    }
  }

  function save() {
    try {
      localStorage.setItem(KEYS.conversations, JSON.stringify(conversations));
      localStorage.setItem(KEYS.current, JSON.stringify(currentId));
      localStorage.setItem(KEYS.settings, JSON.stringify(settings));
    } catch (e) {
      showError(`the conversations could not be saved: ${e.message}`);
    }
  }

  let conversations = load(KEYS.conversations, []);
  let currentId = load(KEYS.current, null);
  let settings = load(KEYS.settings, {});
  let controller = null;   // the running request's AbortController; null when idle

  if (!Array.isArray(conversations)) conversations = [];
  conversations = conversations.filter((c) => c && typeof c.id === "string" && Array.isArray(c.messages));
  for (const conv of conversations) {
    for (const m of conv.messages) if (m.state === "streaming") m.state = "stopped";   // a reload mid-answer
  }

  const current = () => conversations.find((c) => c.id === currentId);
  const newId = () => Date.now().toString(36) + Math.random().toString(36).slice(2, 8);

  // --- conversations --------------------------------------------------------------------

  function newConversation() {
    if (controller) return;
    const conv = current();
    if (!conv || conv.messages.length) {   // an empty one is reused rather than doubled
      conversations.unshift({id: newId(), title: "", messages: []});
      currentId = conversations[0].id;
    }
    save();
    render();
    $("input").focus();
  }

  function switchTo(id) {
    if (controller || id === currentId) return;
    currentId = id;
    hideError();
    save();
    render();
  }

  function remove(id) {
    if (controller) return;
    conversations = conversations.filter((c) => c.id !== id);
    if (id === currentId) currentId = conversations.length ? conversations[0].id : null;
    if (!current()) newConversation();
    save();
    render();
  }

  function renderList() {
    const list = $("conversations");
    list.replaceChildren();
    for (const conv of conversations) {
      const item = document.createElement("li");
      item.className = "conv" + (conv.id === currentId ? " current" : "");
      item.dataset.id = conv.id;
      const title = document.createElement("span");
      title.className = "conv-title";
      title.textContent = conv.title || "New conversation";
      title.addEventListener("click", () => switchTo(conv.id));
      const del = document.createElement("button");
      del.type = "button";
      del.className = "conv-delete";
      del.textContent = "×";
      del.title = "Delete this conversation";
      del.setAttribute("aria-label", del.title);
      del.addEventListener("click", () => remove(conv.id));
      item.append(title, del);
      list.append(item);
    }
  }

  function render() {
    renderList();
    const box = $("messages");
    box.replaceChildren(...current().messages.map((m) => {
      const el = messageElement(m);
      update(el, m, false);
      return el;
    }));
    box.scrollTop = box.scrollHeight;
  }

  // --- messages -------------------------------------------------------------------------

  function child(parent, tag, className) {
    const el = document.createElement(tag);
    el.className = className;
    parent.append(el);
    return el;
  }

  function messageElement(msg) {
    const el = document.createElement("div");
    el.className = `msg ${msg.role}`;
    if (msg.role === "assistant") {
      const details = child(el, "details", "reasoning");
      details.hidden = true;
      child(details, "summary", "").textContent = "Reasoning";
      child(details, "div", "reasoning-text");
      child(el, "div", "tool-calls");
    }
    child(el, "div", "content");
    return el;
  }

  // The element shows msg: texts set, reasoning folded once the answer starts or ends.
  function update(el, msg, streaming) {
    el.dataset.state = msg.state || "done";
    el.querySelector(".content").textContent = msg.content;
    if (msg.role !== "assistant") return;
    const calls = msg.toolCalls || [];
    const details = el.querySelector(".reasoning");
    if (msg.reasoning) {
      if (details.hidden) {
        details.hidden = false;
        details.open = streaming;   // open while the model thinks
      }
      details.querySelector(".reasoning-text").textContent = msg.reasoning;
      if ((msg.content || calls.length || !streaming) && !details.dataset.folded) {
        details.open = false;
        details.dataset.folded = "1";
      }
    }
    const box = el.querySelector(".tool-calls");
    calls.forEach((call, i) => {
      let block = box.children[i];
      if (!block) {
        block = child(box, "div", "tool-call");
        child(block, "div", "tool-name");
        child(block, "pre", "tool-args");
      }
      block.dataset.id = call.id || "";
      block.querySelector(".tool-name").textContent = call.name;
      block.querySelector(".tool-args").textContent = call.arguments;
    });
  }

  // --- the request ----------------------------------------------------------------------

  function requestBody(history, text) {
    const messages = settings.system ? [{role: "system", content: settings.system}] : [];
    for (const m of history) messages.push({role: m.role, content: m.content});
    messages.push({role: "user", content: text});
    const body = {messages, stream: true};
    for (const name of NUMBERS) {
      if (settings[name] !== undefined && settings[name] !== "") body[name] = Number(settings[name]);
    }
    if (settings.tools && settings.tools.trim()) {
      let tools;
      try {
        tools = JSON.parse(settings.tools);
      } catch (e) {
        throw new Error(`the tools are not valid JSON: ${e.message}`);
      }
      if (!Array.isArray(tools)) throw new Error("the tools must be a JSON array (OpenAI's tools)");
      body.tools = tools;
      body.tool_choice = settings.tool_choice || "auto";
    }
    return body;
  }

  function headers() {
    const h = {"Content-Type": "application/json"};
    if (settings["api-key"]) h.Authorization = `Bearer ${settings["api-key"]}`;
    return h;
  }

  async function httpError(res) {
    let message = res.statusText;
    try {
      message = (await res.json()).error.message || message;
    } catch {
      // not the server's JSON error: the status line says it
    }
    if (res.status === 401) {
      return new Error(`invalid API key (401: ${message}): set the server's --api-key in Settings`);
    }
    return new Error(`the server answered ${res.status}: ${message}`);
  }

  // Reads the SSE stream, handing each delta of choice 0 to onDelta; ends at `data: [DONE]`.
  async function readStream(res, onDelta) {
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, {stream: true});
      let end;
      while ((end = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, end).replace(/\r$/, "");
        buffer = buffer.slice(end + 1);
        if (!line.startsWith("data:")) continue;   // blank separators and ":" pings
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(`the server failed: ${chunk.error.message}`);
        for (const choice of chunk.choices || []) {
          if (!choice.index && choice.delta) onDelta(choice.delta);
        }
      }
    }
  }

  function applyDelta(answer, delta) {
    if (delta.reasoning_content) answer.reasoning += delta.reasoning_content;
    if (delta.content) answer.content += delta.content;
    for (const part of delta.tool_calls || []) {
      const i = part.index ?? answer.toolCalls.length;
      const call = answer.toolCalls[i] || (answer.toolCalls[i] = {id: "", name: "", arguments: ""});
      if (part.id) call.id = part.id;
      if (part.function && part.function.name) call.name = part.function.name;
      if (part.function && part.function.arguments) call.arguments += part.function.arguments;
    }
  }

  async function send(text) {
    const conv = current();
    hideError();
    let body;
    try {
      body = requestBody(conv.messages, text);
    } catch (e) {
      showError(e.message);
      return;
    }
    const answer = {role: "assistant", content: "", reasoning: "", toolCalls: [], state: "streaming"};
    conv.messages.push({role: "user", content: text}, answer);
    if (!conv.title) conv.title = text.slice(0, 60);
    render();
    const el = $("messages").lastElementChild;
    setBusy(new AbortController());
    try {
      const res = await fetch("/v1/chat/completions", {method: "POST", headers: headers(),
                                                        body: JSON.stringify(body), signal: controller.signal});
      if (!res.ok) throw await httpError(res);
      await readStream(res, (delta) => {
        applyDelta(answer, delta);
        update(el, answer, true);
        $("messages").scrollTop = $("messages").scrollHeight;
      });
      answer.state = "done";
    } catch (e) {
      answer.state = e.name === "AbortError" ? "stopped" : "error";
      if (answer.state === "error") showError(e.message);
    }
    setBusy(null);
    const nothing = !answer.content && !answer.reasoning && !answer.toolCalls.length;
    if (answer.state === "error" && nothing) {   // the message goes back to the box, to send again
      conv.messages.splice(-2, 2);
      if (!$("input").value) $("input").value = text;
      if (!conv.messages.length) conv.title = "";
      render();
    } else {
      update(el, answer, false);
    }
    save();
  }

  function setBusy(abort) {
    controller = abort;
    $("send").disabled = abort !== null;
    $("stop").disabled = abort === null;
    document.body.classList.toggle("busy", abort !== null);
  }

  function showError(text) {
    $("error").textContent = text;
    $("error").hidden = false;
  }

  function hideError() {
    $("error").hidden = true;
    $("error").textContent = "";
  }

  // --- settings and the page ------------------------------------------------------------

  function readSettings() {
    for (const name of [...NUMBERS, ...TEXTS]) settings[name] = $(name).value;
    save();
  }

  function showModel() {
    fetch("/v1/models", {headers: headers()})
      .then((res) => (res.ok ? res.json() : null))
      .then((models) => {
        const id = models && models.data && models.data[0] ? models.data[0].id : "";
        $("model").textContent = id.split("/").pop();
      })
      .catch(() => {});   // the title is a nicety: the chat works without it
  }

  function init() {
    for (const name of [...NUMBERS, ...TEXTS]) {
      if (settings[name] !== undefined) $(name).value = settings[name];
    }
    $("settings").addEventListener("input", readSettings);
    $("settings").addEventListener("change", readSettings);
    $("settings").addEventListener("submit", (e) => e.preventDefault());
    $("settings-toggle").addEventListener("click", () => {
      const form = $("settings");
      form.hidden = !form.hidden;
      $("settings-toggle").setAttribute("aria-expanded", String(!form.hidden));
    });
    $("new-conv").addEventListener("click", newConversation);
    $("stop").addEventListener("click", () => controller && controller.abort());
    $("composer").addEventListener("submit", (e) => {
      e.preventDefault();
      const text = $("input").value.trim();
      if (!text || controller) return;
      $("input").value = "";
      send(text);
    });
    $("input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        $("composer").requestSubmit();
      }
    });
    if (!current()) {
      currentId = null;
      newConversation();
    }
    render();
    showModel();
    document.body.dataset.ready = "1";
  }

  init();
})();
