/* ggmlpy viz: the page's code. Plain browser JavaScript, no build step, no network.
 *
 * The data (ggmlpy/viz/data.py documents its shape) is inline JSON. The graph is drawn as
 * SVG from a dagre layout of what is visible: layers and fusion groups start collapsed
 * into one box each, so a whole model lays out in milliseconds; clicking a box expands it
 * and only the visible graph is laid out again. Tabs: the optimised graph (backends as
 * colours, splits as boxes, copies as nodes), the pass pipeline (the graph after each pass
 * with its changes), the buffer plan (lifetime chart) and the profile (tables).
 */
"use strict";
(function () {
  const t0 = performance.now();
  const DATA = JSON.parse(document.getElementById("viz-data").textContent);
  const T = DATA.tensors;                       // every tensor of every stage, by uid
  const INFO = new Map();                       // uid -> the optimised graph's facts
  DATA.graph.order.forEach((uid, i) => INFO.set(uid, DATA.graph.info[i]));
  const GROUP_OF = new Map();                   // uid -> fusion group index
  DATA.groups.forEach((g, i) => g.nodes.forEach((uid) => GROUP_OF.set(uid, i)));
  const COLOUR = {};
  DATA.backends.forEach((b) => { COLOUR[b.name] = b.colour; });
  const HAS_PROFILE = DATA.profile !== null;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);

  // ---------------------------------------------------------------------------------------
  // helpers
  const el = (tag, attrs, ...children) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "onclick") e.addEventListener("click", v); else e.setAttribute(k, v);
    }
    for (const c of children) e.append(c instanceof Node ? c : String(c));
    return e;
  };
  const svg = (tag, attrs) => {
    const e = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  };
  const bytes = (n) => n >= 1 << 20 ? (n / (1 << 20)).toFixed(2) + " MiB"
    : n >= 1024 ? (n / 1024).toFixed(1) + " KiB" : n + " B";
  const us = (x) => x >= 1000 ? (x / 1000).toFixed(2) + " ms" : x.toFixed(1) + " µs";
  const shape = (t) => {
    let n = 4;
    while (n > 1 && t.ne[n - 1] === 1) n--;
    return "[" + t.ne.slice(0, n).join(", ") + "]";
  };
  const label = (uid) => T[uid].name || (INFO.has(uid) ? INFO.get(uid).key : "#" + uid);
  const timeOf = (uid) => (INFO.has(uid) && INFO.get(uid).time) || 0;

  // ---------------------------------------------------------------------------------------
  // scenes: a set of tensors to draw, with its own expansion state
  function makeScene(order, opts) {
    const inGraph = new Set(order);
    const removed = opts.removed || [];
    const uids = order.concat(removed.filter((u) => !inGraph.has(u)));
    const present = new Set(uids);
    const consumers = new Map();
    for (const u of uids) {
      for (const s of T[u].src) {
        if (!consumers.has(s)) consumers.set(s, []);
        consumers.get(s).push(u);
      }
    }
    return {
      uids, present, consumers, grouped: !!opts.grouped, status: opts.status || new Map(),
      final: !!opts.final, openLayers: new Set(), openGroups: new Set(), transform: null,
    };
  }

  // what a tensor is drawn as in a scene: its layer's box, its group's box, or itself
  function repOf(scene, uid) {
    const layer = T[uid].layer;
    if (layer !== undefined && !scene.openLayers.has(layer)) return "L" + layer;
    if (scene.grouped && GROUP_OF.has(uid) && !scene.openGroups.has(GROUP_OF.get(uid))) {
      return "G" + GROUP_OF.get(uid);
    }
    return "t" + uid;
  }

  // the split a tensor is drawn in: its own, or (leafs) that of its first consumer
  function splitOf(scene, uid) {
    const info = INFO.get(uid);
    if (info && info.split !== undefined) return info.split;
    for (const c of scene.consumers.get(uid) || []) {
      const ci = INFO.get(c);
      if (ci && ci.split !== undefined) return ci.split;
    }
    return undefined;
  }

  // the visible graph: items (boxes) and edges between them
  function visibleGraph(scene) {
    const items = new Map();
    const edges = new Map();
    const item = (id, kind, uid) => {
      let it = items.get(id);
      if (!it) { it = { id, kind, members: [], uid, split: undefined }; items.set(id, it); }
      return it;
    };
    for (const u of scene.uids) {
      const id = repOf(scene, u);
      const kind = id[0] === "L" ? "layer" : id[0] === "G" ? "group" : "tensor";
      const it = item(id, kind, kind === "tensor" ? u : undefined);
      it.members.push(u);
      if (it.split === undefined && (kind === "tensor" || !T[u].flags.includes("W"))) it.split = splitOf(scene, u);
    }
    const addEdge = (a, b, kind) => {
      if (a === b) return;
      const k = a + ">" + b;
      if (!edges.has(k)) edges.set(k, { from: a, to: b, kind });
    };
    // copies: the consumer's reads of a copied tensor go through the copy's node
    const copyFor = new Map();
    if (scene.final) {
      DATA.copies.forEach((c, i) => {
        copyFor.set(c.tensor + "|" + c.to, i);
        const layer = T[c.consumer].layer;
        const id = layer !== undefined && !scene.openLayers.has(layer) ? "L" + layer : "c" + i;
        const it = item(id, id[0] === "L" ? "layer" : "copy");
        if (it.kind === "copy") { it.copy = i; it.split = c.split; }
        addEdge(repOf(scene, c.tensor), id, "copy");
      });
    }
    for (const u of scene.uids) {
      const b = repOf(scene, u);
      const info = INFO.get(u);
      for (const s of T[u].src) {
        if (!scene.present.has(s)) continue;
        const ci = scene.final && info ? copyFor.get(s + "|" + info.backend) : undefined;
        if (ci !== undefined) {
          const c = DATA.copies[ci];
          const layer = T[c.consumer].layer;
          addEdge(layer !== undefined && !scene.openLayers.has(layer) ? "L" + layer : "c" + ci, b, "copy");
        } else {
          addEdge(repOf(scene, s), b, "src");
        }
      }
      const vs = T[u].view_src;
      if (vs !== undefined && scene.present.has(vs) && !T[u].src.includes(vs)) addEdge(repOf(scene, vs), b, "view");
    }
    // a box feeding many others (the positions, the masks) would cross the whole drawing
    // once per reader, and such long edges cost dagre most of its time: they are left out
    // of the layout and the box says how many it feeds (the panel lists every consumer)
    const targets = new Map();
    for (const e of edges.values()) targets.set(e.from, (targets.get(e.from) || 0) + 1);
    const kept = [];
    for (const e of edges.values()) {
      if (targets.get(e.from) > FANOUT_LIMIT) items.get(e.from).fanout = targets.get(e.from);
      else kept.push(e);
    }
    return { items, edges: kept };
  }
  const FANOUT_LIMIT = 6;

  // ---------------------------------------------------------------------------------------
  // drawing one item
  function itemText(scene, it) {
    if (it.kind === "layer") {
      const layer = Number(it.id.slice(1));
      const nodes = it.members.filter((u) => T[u].op !== "none").length;
      const backends = [...new Set(it.members.filter((u) => INFO.has(u) && T[u].op !== "none")
        .map((u) => INFO.get(u).backend))];
      let sub = nodes + " nodes" + (backends.length ? " · " + backends.join(", ") : "");
      if (HAS_PROFILE && scene.final) sub += " · " + us(it.members.reduce((a, u) => a + timeOf(u), 0));
      const st = stageCounts(scene, it.members);
      return ["layer " + layer + (st ? "  " + st : ""), sub];
    }
    if (it.kind === "group") {
      const g = DATA.groups[Number(it.id.slice(1))];
      let sub = g.nodes.length + " nodes · " + (g.one_kernel ? "one kernel" : "node by node");
      if (HAS_PROFILE && scene.final) sub += " · " + us(g.nodes.reduce((a, u) => a + timeOf(u), 0));
      return ["⧉ " + g.pattern, sub];
    }
    if (it.kind === "copy") {
      const c = DATA.copies[it.copy];
      return ["copy → " + c.to, label(c.tensor) + " · " + bytes(c.bytes)];
    }
    const t = T[it.uid];
    const head = t.op === "none" ? label(it.uid) : (t.name || (INFO.has(it.uid) ? INFO.get(it.uid).key : ""));
    let sub = (t.op === "none" ? "" : t.op + " ") + t.type + " " + shape(t);
    if (it.fanout) sub += " · feeds " + it.fanout + " boxes";
    if (HAS_PROFILE && scene.final && timeOf(it.uid)) sub += " · " + us(timeOf(it.uid));
    return [head || t.op, sub];
  }

  function stageCounts(scene, members) {
    if (!scene.status.size) return "";
    let a = 0, r = 0, w = 0;
    for (const u of members) {
      const s = scene.status.get(u);
      if (s === "added") a++; else if (s === "removed") r++; else if (s === "rewritten") w++;
    }
    return (a ? "+" + a + " " : "") + (r ? "−" + r + " " : "") + (w ? "~" + w : "");
  }

  let heatMax = 0;
  function fillOf(scene, it) {
    if (heatOn() && scene.final) {
      const time = it.kind === "copy" ? 0 : it.members.reduce((a, u) => a + timeOf(u), 0);
      const x = heatMax > 0 ? Math.sqrt(time / heatMax) : 0;   // sqrt: small nodes stay visible
      return `rgb(255,${Math.round(255 - 200 * x)},${Math.round(255 - 230 * x)})`;
    }
    if (it.kind === "copy") return COLOUR.copy;
    const u = it.kind === "tensor" ? it.uid : it.members.find((m) => T[m].op !== "none" && INFO.has(m));
    if (u === undefined || !INFO.has(u)) return "#eee";
    if (T[u].op === "none") return T[u].flags.includes("W") ? "#fff8d0" : "#eaf5ea";
    return COLOUR[INFO.get(u).backend] || "#fff";
  }

  const heatOn = () => $("heat").checked && HAS_PROFILE;

  // ---------------------------------------------------------------------------------------
  // layout and render
  let current = null;          // the scene on screen
  let lastLayout = null;       // {positions: Map id -> {x, y}}
  let selected = null;         // uid of the selected tensor

  function render(scene, anchor) {
    const tl = performance.now();
    const vis = visibleGraph(scene);
    const useSplits = scene.final && DATA.splits.length > 1;
    const g = new dagre.graphlib.Graph({ compound: useSplits });
    g.setGraph({ rankdir: "TB", nodesep: 16, ranksep: 26, marginx: 24, marginy: 24 });
    g.setDefaultEdgeLabel(() => ({}));
    const texts = new Map();
    for (const it of vis.items.values()) {
      const lines = itemText(scene, it);
      texts.set(it.id, lines);
      const width = Math.max(60, 7 * Math.max(lines[0].length, lines[1].length * 0.92) + 18);
      g.setNode(it.id, { width, height: it.kind === "layer" ? 40 : 32 });
      if (useSplits && it.split !== undefined) {
        const sid = "S" + it.split;
        if (!g.hasNode(sid)) g.setNode(sid, { label: sid });
        g.setParent(it.id, sid);
      }
    }
    for (const e of vis.edges) g.setEdge(e.from, e.to);
    dagre.layout(g);

    const vp = $("viewport");
    vp.replaceChildren();
    const splitLayer = svg("g"), edgeLayer = svg("g"), nodeLayer = svg("g");
    vp.append(splitLayer, edgeLayer, nodeLayer);
    if (useSplits) {
      for (const id of g.nodes()) {
        if (id[0] !== "S") continue;
        const n = g.node(id), s = DATA.splits[Number(id.slice(1))];
        const box = svg("g", { class: "split", "data-split": s.index });
        box.append(svg("rect", { x: n.x - n.width / 2, y: n.y - n.height / 2, width: n.width, height: n.height, rx: 8 }));
        const tx = svg("text", { x: n.x - n.width / 2 + 6, y: n.y - n.height / 2 + 13 });
        tx.textContent = `split #${s.index} · ${s.backend} · ${s.n_compute} nodes, ${s.copies.length} copies in`;
        box.append(tx);
        splitLayer.append(box);
      }
    }
    for (const e of vis.edges) {
      const pts = g.edge(e.from, e.to).points;
      const d = "M" + pts.map((p) => p.x.toFixed(1) + "," + p.y.toFixed(1)).join("L");
      edgeLayer.append(svg("path", { d, class: "edge " + e.kind, "marker-end": "url(#arrow)" }));
    }
    const positions = new Map();
    for (const it of vis.items.values()) {
      const n = g.node(it.id);
      positions.set(it.id, { x: n.x, y: n.y });
      const cls = ["node", it.kind];
      if (it.kind === "tensor") {
        if (T[it.uid].op === "none") cls.push("leaf");
        const st = scene.status.get(it.uid);
        if (st) cls.push(st);
        if (it.uid === selected) cls.push("selected");
      }
      const ge = svg("g", { class: cls.join(" "), "data-id": it.id, transform: `translate(${n.x - n.width / 2},${n.y - n.height / 2})` });
      ge.append(svg("rect", { width: n.width, height: n.height, rx: 3, fill: fillOf(scene, it) }));
      const [a, b] = texts.get(it.id);
      const ta = svg("text", { x: 8, y: 13 }); ta.textContent = a;
      const tb = svg("text", { x: 8, y: 26, class: "sub" }); tb.textContent = b;
      ge.append(ta, tb);
      const tip = svg("title"); tip.textContent = a + "\n" + b; ge.append(tip);
      nodeLayer.append(ge);
    }
    const graphSize = g.graph();
    // keep what was clicked where it was; the first time, fit the whole graph
    if (anchor && lastLayout && lastLayout.positions.has(anchor.from) && scene.transform) {
      const old = lastLayout.positions.get(anchor.from);
      const now = positions.get(anchor.to) || positions.get(anchor.from);
      if (now) {
        scene.transform.x += (old.x - now.x) * scene.transform.k;
        scene.transform.y += (old.y - now.y) * scene.transform.k;
      }
    } else if (!scene.transform) {
      scene.transform = startTransform(graphSize.width, graphSize.height);
    }
    scene.size = graphSize;
    applyTransform(scene);
    lastLayout = { positions, scene };
    current = scene;
    $("status").replaceChildren(statusLine(scene, vis, performance.now() - tl));
    return vis;
  }

  function statusLine(scene, vis, ms) {
    const span = el("span");
    span.append(`${vis.items.size} boxes, ${vis.edges.length} edges (layout ${ms.toFixed(0)} ms) · ${DATA.meta.summary.split(";")[0]} · backends:`);
    for (const b of DATA.backends) {
      span.append(el("span", { class: "legend-swatch", style: "background:" + b.colour }), b.name);
    }
    return span;
  }

  // ---------------------------------------------------------------------------------------
  // pan and zoom
  function fitTransform(w, h) {
    const r = $("canvas").getBoundingClientRect();
    const k = Math.min(1.2, Math.max(0.05, Math.min(r.width / (w + 20), r.height / (h + 20))));
    return { k, x: (r.width - w * k) / 2, y: Math.max(4, (r.height - h * k) / 2) };
  }
  // the first view of a scene: readable text (zoom at least 0.55), its top in view
  function startTransform(w, h) {
    const r = $("canvas").getBoundingClientRect();
    const k = Math.min(1.2, Math.max(0.55, Math.min(r.width / (w + 20), r.height / (h + 20))));
    return { k, x: Math.max(4, (r.width - w * k) / 2), y: Math.max(4, (r.height - h * k) / 2) };
  }
  function applyTransform(scene) {
    const t = scene.transform;
    $("viewport").setAttribute("transform", `translate(${t.x},${t.y}) scale(${t.k})`);
  }
  function centerOn(id) {
    const p = lastLayout && lastLayout.positions.get(id);
    if (!p) return;
    const r = $("canvas").getBoundingClientRect();
    const t = current.transform;
    t.k = Math.max(t.k, 0.8);
    t.x = r.width / 2 - p.x * t.k;
    t.y = r.height / 2 - p.y * t.k;
    applyTransform(current);
  }
  (function panZoom() {
    const c = $("canvas");
    let drag = null;
    c.addEventListener("wheel", (ev) => {
      ev.preventDefault();
      const t = current.transform, r = c.getBoundingClientRect();
      const f = Math.exp(-ev.deltaY * 0.0015), mx = ev.clientX - r.left, my = ev.clientY - r.top;
      t.x = mx - (mx - t.x) * f; t.y = my - (my - t.y) * f; t.k *= f;
      applyTransform(current);
    }, { passive: false });
    c.addEventListener("mousedown", (ev) => { drag = { x: ev.clientX, y: ev.clientY, moved: false }; c.classList.add("dragging"); });
    window.addEventListener("mousemove", (ev) => {
      if (!drag) return;
      const dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 2) drag.moved = true;
      current.transform.x += dx; current.transform.y += dy;
      drag.x = ev.clientX; drag.y = ev.clientY;
      applyTransform(current);
    });
    window.addEventListener("mouseup", () => { c.classList.remove("dragging"); setTimeout(() => { drag = null; }, 0); });
    c.addEventListener("click", (ev) => {
      if (drag && drag.moved) return;
      const node = ev.target.closest("g.node");
      if (node) activate(node.getAttribute("data-id"));
    });
  })();
  const arrow = svg("defs");
  arrow.innerHTML = '<marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" orient="auto"><path d="M0,0L10,5L0,10z" fill="#999"/></marker>';
  $("canvas").prepend(arrow);

  // a click on a box: layers and groups open, tensors and copies are shown in the panel
  function activate(id) {
    const scene = current;
    if (id[0] === "L") {
      const layer = Number(id.slice(1));
      scene.openLayers.add(layer);
      const first = visibleAfterOpen(scene, layer);
      render(scene, { from: id, to: first });
      showLayer(scene, layer);
    } else if (id[0] === "G") {
      const gi = Number(id.slice(1));
      scene.openGroups.add(gi);
      render(scene, { from: id, to: "t" + DATA.groups[gi].nodes[0] });
      showGroup(scene, gi);
    } else if (id[0] === "c") {
      showCopy(Number(id.slice(1)));
    } else {
      select(Number(id.slice(1)));
    }
  }
  function visibleAfterOpen(scene, layer) {
    const u = scene.uids.find((m) => T[m].layer === layer && T[m].op !== "none");
    return u === undefined ? undefined : repOf(scene, u);
  }

  function select(uid) {
    selected = uid;
    for (const n of document.querySelectorAll("g.node.selected")) n.classList.remove("selected");
    const n = document.querySelector(`g.node[data-id="t${uid}"]`);
    if (n) n.classList.add("selected");
    showTensor(current, uid);
  }

  // make a tensor visible (open its layer and group), centre on it and select it
  function reveal(uid) {
    const scene = current;
    if (!scene.present.has(uid)) return;
    const layer = T[uid].layer;
    let changed = false;
    if (layer !== undefined && !scene.openLayers.has(layer)) { scene.openLayers.add(layer); changed = true; }
    if (scene.grouped && GROUP_OF.has(uid) && !scene.openGroups.has(GROUP_OF.get(uid))) {
      scene.openGroups.add(GROUP_OF.get(uid)); changed = true;
    }
    selected = uid;
    if (changed) render(scene);
    centerOn("t" + uid);
    select(uid);
  }

  // ---------------------------------------------------------------------------------------
  // the panel
  const panel = $("panel");
  const link = (uid) => el("a", { onclick: () => reveal(uid), title: T[uid].op }, label(uid));
  const links = (uids, limit) => {
    const span = el("span");
    uids.slice(0, limit || 60).forEach((u, i) => { if (i) span.append(", "); span.append(link(u)); });
    if (uids.length > (limit || 60)) span.append(` … (${uids.length})`);
    if (!uids.length) span.append("—");
    return span;
  };
  const row = (k, v) => el("tr", {}, el("td", {}, k), el("td", {}, v));

  function showTensor(scene, uid) {
    const t = T[uid], info = INFO.get(uid);
    const rows = [
      row("key", info ? info.key : "(not in the optimised graph)"), row("op", t.op), row("type", t.type),
      row("ne", "[" + t.ne.join(", ") + "]"), row("nb", "[" + t.nb.join(", ") + "]"),
      row("flags", t.flags || "—"), row("layer", t.layer === undefined ? "—" : t.layer),
    ];
    if (t.params) rows.push(row("params", JSON.stringify(t.params)));
    if (t.view_src !== undefined) rows.push(row("view of", el("span", {}, link(t.view_src), ` at offset ${t.view_offs}`)));
    if (scene.status.has(uid)) rows.push(row("this pass", scene.status.get(uid)));
    const parts = [el("h2", {}, label(uid)), el("table", {}, ...rows),
      el("h3", {}, "sources"), links(t.src),
      el("h3", {}, "consumers"), links(scene.consumers.get(uid) || [])];
    if (info) {
      parts.push(el("h3", {}, "schedule"), el("table", {},
        row("backend", el("span", {}, el("span", { class: "legend-swatch", style: "background:" + (COLOUR[info.backend] || "#fff") }), info.backend)),
        row("cause", info.cause + (info.fallback ? " (fallback)" : "")),
        row("split", info.split === undefined ? "— (a leaf: bound by name)" : "#" + info.split)));
      parts.push(el("h3", {}, "buffer"), bufferInfo(uid, t, info));
      if (info.group !== undefined) {
        const g = DATA.groups[info.group];
        parts.push(el("h3", {}, "fusion group"), el("div", {},
          el("a", { onclick: () => showGroup(scene, info.group) }, g.pattern),
          g.one_kernel ? " — runs as one kernel" : " — marked; this backend runs it node by node"));
      }
      if (info.time !== undefined) {
        parts.push(el("h3", {}, "profile"), el("table", {}, row("time", us(info.time) + " per step"),
          row("kernel / thread", info.k.map(us).join(", ")), row("barrier / thread", info.b.map(us).join(", "))));
      }
      if (info.kernel !== undefined) parts.push(...kernelPart(info.kernel, info.launch));
      else if (t.op !== "none") parts.push(el("h3", {}, "kernel"), el("div", { class: "muted" }, kernelAbsence(t, info)));
    }
    panel.replaceChildren(...parts);
  }

  function kernelAbsence(t, info) {
    if (info.backend === "ref") return "runs on the numpy reference backend: no generated code";
    if (t.view_src !== undefined) return "a view: no code (it only re-describes memory)";
    return "no kernel recorded for this node";
  }

  function bufferInfo(uid, t, info) {
    if (info.offset !== undefined) {
      const rows = [row("arena offset", info.offset + " (" + bytes(info.offset) + ")"), row("size", bytes(info.size)),
        row("step", info.step)];
      if (info.inplace_of !== undefined) rows.push(row("in place of", link(info.inplace_of)));
      return el("table", {}, ...rows);
    }
    if (t.op === "none") return el("div", { class: "muted" }, "a leaf: weights, inputs and KV cache are bound by name outside the arena");
    if (t.view_src !== undefined) return el("div", { class: "muted" }, "a view: lives in the memory of ", link(t.view_src));
    if (info.group !== undefined) return el("div", { class: "muted" }, "interior of its fusion group: never materialised, no memory");
    return el("div", { class: "muted" }, "no arena memory");
  }

  function kernelPart(ki, launch) {
    const k = DATA.kernels[ki];
    const pre = el("pre", { class: "code", id: "code" }, "inflating …");
    inflate(k.code).then((text) => {
      const limit = 200000;
      pre.textContent = text.length > limit ? text.slice(0, limit) : text;
      if (text.length > limit) {
        const more = el("button", { onclick: () => { pre.textContent = text; more.remove(); } },
          `show all ${(text.length / 1024).toFixed(0)} KiB`);
        pre.after(more);
      }
    });
    return [el("h3", {}, "kernel"), el("table", {},
      row("name", k.name), row("backend", k.backend),
      row("code", k.language === "llvm" ? "LLVM IR (CPU)" : "CUDA C"),
      row("shared by", k.n_nodes + " nodes"), row("launch", launch ? `#${launch[1]} of split #${launch[0]}` : "—")), pre];
  }

  // gzip + base64 -> text, through the browser's own DecompressionStream
  const inflated = new Map();
  function inflate(b64) {
    if (!inflated.has(b64)) {
      const raw = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
      const stream = new Blob([raw]).stream().pipeThrough(new DecompressionStream("gzip"));
      inflated.set(b64, new Response(stream).text());
    }
    return inflated.get(b64);
  }

  function showLayer(scene, layer) {
    const members = scene.uids.filter((u) => T[u].layer === layer);
    const ops = {};
    for (const u of members) if (T[u].op !== "none") ops[T[u].op] = (ops[T[u].op] || 0) + 1;
    const parts = [el("h2", {}, "layer " + layer),
      el("div", {}, `${members.length} tensors; ops: ` + Object.entries(ops).map(([o, n]) => `${o} ${n}`).join(", ")),
      el("p", {}, el("a", { onclick: () => { scene.openLayers.delete(layer); render(scene); } }, "collapse this layer"))];
    if (HAS_PROFILE && scene.final) parts.push(el("div", {}, "time per step: " + us(members.reduce((a, u) => a + timeOf(u), 0))));
    parts.push(el("h3", {}, "tensors"), links(members.filter((u) => T[u].op !== "none"), 400));
    panel.replaceChildren(...parts);
  }

  function showGroup(scene, gi) {
    const g = DATA.groups[gi];
    const parts = [el("h2", {}, "fusion group " + gi + ": " + g.pattern),
      el("div", {}, g.one_kernel ? "runs as one kernel" : "marked by the fusion pass; the backend runs its nodes one by one"),
      el("h3", {}, "nodes"), links(g.nodes), el("h3", {}, "inputs"), links(g.inputs), el("h3", {}, "outputs"), links(g.outputs),
      el("p", {}, el("a", { onclick: () => { scene.openGroups.delete(gi); render(scene); } }, "collapse this group"))];
    if (HAS_PROFILE && scene.final) parts.push(el("div", {}, "time per step: " + us(g.nodes.reduce((a, u) => a + timeOf(u), 0))));
    const ki = INFO.has(g.nodes[0]) ? INFO.get(g.nodes[g.nodes.length - 1]).kernel : undefined;
    if (ki !== undefined) parts.push(...kernelPart(ki, INFO.get(g.nodes[g.nodes.length - 1]).launch));
    panel.replaceChildren(...parts);
  }

  function showCopy(i) {
    const c = DATA.copies[i];
    panel.replaceChildren(el("h2", {}, c.name), el("table", {},
      row("tensor", link(c.tensor)), row("from", c.from), row("to", c.to), row("before split", "#" + c.split),
      row("first reader", link(c.consumer)), row("bytes", c.bytes + " (" + bytes(c.bytes) + ")")));
  }

  function showOverview() {
    const m = DATA.meta, b = DATA.buffers;
    const parts = [el("h2", {}, m.title), el("table", {},
      row("model", m.model), row("ubatch", m.ubatch + (m.ubatch === 1 ? " (one-token decode graph)" : " (prompt graph)")),
      row("n_ctx", m.n_ctx), row("pipeline", m.pipeline), row("signature", m.signature),
      row("splits", DATA.splits.map((s) => `#${s.index} ${s.backend} (${s.n_compute})`).join(", ")),
      row("copies", DATA.copies.length), row("kernels", DATA.kernels.length),
      row("arena", bytes(b.arena_size) + ", peak " + bytes(b.peak_bytes))),
      el("p", { class: "muted" }, "Click a layer or fusion group to expand it, a node to see it here. Drag to pan, wheel to zoom."),
      el("p", { class: "muted" }, m.summary)];
    for (const n of m.notes) parts.push(el("p", { class: "muted" }, n));
    panel.replaceChildren(...parts);
  }

  // ---------------------------------------------------------------------------------------
  // search
  let hits = [];
  function search(q) {
    q = q.trim().toLowerCase();
    for (const n of document.querySelectorAll("g.node.hit")) n.classList.remove("hit");
    if (!q) { hits = []; return; }
    hits = current.uids.filter((u) => {
      const t = T[u], info = INFO.get(u);
      return t.name.toLowerCase().includes(q) || t.op === q || (info && info.key === q);
    });
    const shown = new Set(hits.map((u) => repOf(current, u)));
    for (const id of shown) {
      const n = document.querySelector(`g.node[data-id="${id}"]`);
      if (n) n.classList.add("hit");
    }
    panel.replaceChildren(el("h2", {}, `${hits.length} matches for “${q}”`), links(hits, 300));
  }
  let searchTimer = 0;
  $("search").addEventListener("input", (ev) => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => search(ev.target.value), 150);
  });
  $("search").addEventListener("keydown", (ev) => {
    if (ev.key !== "Enter") return;
    clearTimeout(searchTimer);   // the pending list of matches must not replace the node
    search(ev.target.value);
    if (hits.length) reveal(hits[0]);
  });

  // ---------------------------------------------------------------------------------------
  // tabs: graph, passes, buffers, profile
  const finalScene = makeScene(DATA.graph.order, { final: true, grouped: DATA.groups.length > 0 });
  const stageScenes = new Map();
  function stageScene(i) {
    if (!stageScenes.has(i)) {
      const st = DATA.stages[i];
      const status = new Map();
      st.added.forEach((u) => status.set(u, "added"));
      st.rewritten.forEach(([, u]) => status.set(u, "rewritten"));
      st.removed.forEach((u) => status.set(u, "removed"));
      if (st.grouped && i > 0 && !DATA.stages[i - 1].grouped) {
        DATA.groups.forEach((g) => g.nodes.forEach((u) => status.set(u, "grouped")));
      }
      stageScenes.set(i, makeScene(st.order, { removed: st.removed, status, grouped: st.grouped && i > 0 && DATA.stages[i - 1].grouped }));
    }
    return stageScenes.get(i);
  }
  // the Passes tab opens on the first pass that changed something
  let stageIndex = Math.max(0, DATA.stages.findIndex((st) => st.added.length + st.removed.length > 0));

  function showStage(i) {
    stageIndex = i;
    const st = DATA.stages[i];
    for (const b of $("stage-bar").children) b.classList.toggle("active", Number(b.dataset.stage) === i);
    render(stageScene(i));
    const parts = [el("h2", {}, i === 0 ? "as built" : "after " + st.name), el("div", { class: "muted" }, st.doc)];
    if (st.nodes_before !== undefined) {
      parts.push(el("table", {}, row("nodes", `${st.nodes_before} → ${st.nodes_after}`),
        row("time", (st.seconds * 1000).toFixed(1) + " ms"),
        row("changes", el("span", {}, el("span", { class: "badge b-add" }, "+" + st.added.length + " added"),
          el("span", { class: "badge b-rm" }, "−" + st.removed.length + " removed"),
          el("span", { class: "badge b-rw" }, "~" + st.rewritten.length + " rewritten")))));
      parts.push(el("h3", {}, "added"), links(st.added, 100), el("h3", {}, "removed"), links(st.removed, 100),
        el("h3", {}, "rewritten (old → new)"));
      const rw = el("div");
      st.rewritten.slice(0, 100).forEach(([a, b]) => rw.append(link(a), " → ", link(b), el("br")));
      parts.push(rw);
    }
    panel.replaceChildren(...parts);
  }

  function buildStageBar() {
    const bar = $("stage-bar");
    DATA.stages.forEach((st, i) => {
      const n = st.added.length + st.removed.length;
      bar.append(el("button", { "data-stage": i, onclick: () => showStage(i) },
        (i === 0 ? "built" : st.name) + (i && n ? ` (+${st.added.length} −${st.removed.length})` : "")));
    });
  }

  function showTab(tab) {
    for (const b of $("tabs").children) b.classList.toggle("active", b.dataset.tab === tab);
    const graphish = tab === "graph" || tab === "passes";
    $("canvas").style.display = graphish ? "" : "none";
    $("chart").hidden = tab !== "buffers";
    $("profile-view").hidden = tab !== "profile";
    $("stage-bar").classList.toggle("on", tab === "passes");
    if (tab === "graph") { render(finalScene); showOverview(); }
    if (tab === "passes") showStage(stageIndex);
    if (tab === "buffers") drawBuffers();
    if (tab === "profile") drawProfile();
  }
  for (const b of $("tabs").children) b.addEventListener("click", () => showTab(b.dataset.tab));

  // ---------------------------------------------------------------------------------------
  // buffer plan: one rectangle per block, x = execution step, y = arena offset
  function drawBuffers() {
    const b = DATA.buffers, box = $("chart");
    if (box.dataset.drawn) return;
    box.dataset.drawn = "1";
    const W = Math.max(600, box.clientWidth - 20), H = Math.max(300, box.clientHeight - 60);
    const left = 70, top = 24, right = 10, bottom = 30, lh = 60;   // lh: live-bytes strip
    const sx = (W - left - right) / Math.max(1, b.n_steps), sy = (H - top - bottom - lh) / Math.max(1, b.arena_size);
    const s = svg("svg", { width: W, height: H, id: "lifetimes" });
    const title = svg("text", { x: left, y: 14 });
    title.textContent = `arena ${bytes(b.arena_size)} · peak ${bytes(b.peak_bytes)} at step ${b.peak_step} · without reuse ${bytes(b.no_reuse_bytes)} · ${b.blocks.length} blocks · env ${JSON.stringify(b.env)}`;
    s.append(title);
    const y0 = top + lh;
    for (const [uid, offset, size, start, end] of b.blocks) {
      const layer = T[uid].layer;
      const hue = layer === undefined ? 0 : (layer * 47) % 360;
      const r = svg("rect", { x: left + start * sx, y: y0 + offset * sy, width: Math.max(1, (end - start + 1) * sx),
        height: Math.max(1, size * sy), fill: layer === undefined ? "#bbb" : `hsl(${hue},55%,70%)`, stroke: "#555",
        "stroke-width": 0.3, class: "block", "data-uid": uid });
      const tip = svg("title");
      tip.textContent = `${label(uid)} (${T[uid].op}) · ${bytes(size)} at ${offset} · steps ${start}–${end}`;
      r.append(tip);
      r.addEventListener("click", () => { showTensor(finalScene, uid); });
      s.append(r);
    }
    // live bytes per step, and the peak
    const maxLive = Math.max(...b.live, 1);
    const pts = b.live.map((v, i) => `${(left + (i + 0.5) * sx).toFixed(1)},${(top + lh - 6 - v / maxLive * (lh - 10)).toFixed(1)}`);
    s.append(svg("polyline", { points: pts.join(" "), fill: "none", stroke: "#335", "stroke-width": 1 }));
    const px = left + (b.peak_step + 0.5) * sx;
    s.append(svg("line", { x1: px, x2: px, y1: top, y2: H - bottom, stroke: "#d00", "stroke-width": 1.2, "stroke-dasharray": "4 3", id: "peak" }));
    const pl = svg("text", { x: px > W / 2 ? px - 4 : px + 4, y: top + 10, fill: "#d00", "text-anchor": px > W / 2 ? "end" : "start" });
    pl.textContent = `peak ${bytes(b.peak_bytes)} (step ${b.peak_step})`;
    s.append(pl);
    s.append(svg("line", { x1: left, x2: W - right, y1: y0 + b.arena_size * sy, y2: y0 + b.arena_size * sy, stroke: "#333" }));
    for (let i = 0; i <= 4; i++) {
      const t = svg("text", { x: 2, y: y0 + b.arena_size * sy * i / 4 + 4 }); t.textContent = bytes(Math.round(b.arena_size * i / 4));
      s.append(t);
    }
    const xl = svg("text", { x: left, y: H - 8 }); xl.textContent = `execution step (node order; a fusion group is one step) 0 … ${b.n_steps - 1}`;
    s.append(xl);
    box.replaceChildren(s);
  }

  // ---------------------------------------------------------------------------------------
  // profile: time per layer, per fusion pattern, per op, and the slowest nodes
  function drawProfile() {
    const box = $("profile-view");
    if (!HAS_PROFILE) {
      box.replaceChildren(el("p", {}, "No profile in this page: run ggmlpy viz --profile (GGMLPY_PROFILE timings of the CPU backend)."));
      return;
    }
    if (box.dataset.drawn) return;
    box.dataset.drawn = "1";
    const p = DATA.profile, sums = (keyOf) => {
      const m = new Map();
      for (const u of DATA.graph.order) {
        const time = timeOf(u);
        if (!time) continue;
        const k = keyOf(u);
        if (k === undefined) continue;
        m.set(k, (m.get(k) || 0) + time);
      }
      return [...m.entries()].sort((a, b) => b[1] - a[1]);
    };
    const table = (title, entries, fmt) => {
      const max = Math.max(...entries.map((e) => e[1]), 1e-9);
      const t = el("table", { class: "bars" });
      for (const [k, v] of entries) {
        t.append(el("tr", {}, el("td", {}, fmt ? fmt(k) : k), el("td", {}, us(v)),
          el("td", { class: "bar" }, el("div", { style: `width:${(300 * v / max).toFixed(0)}px` }))));
      }
      return [el("h3", {}, title), t];
    };
    box.replaceChildren(el("p", {}, `${p.mode}, ${p.steps} step(s), ${p.threads} thread(s), TSC ${p.tsc_ghz} GHz: ` +
      `${us(p.step_us)} per step, ${us(p.native_us)} of it in kernels and barriers`),
    ...table("per layer", sums((u) => T[u].layer === undefined ? "outside layers" : "layer " + T[u].layer)),
    ...table("per fusion group pattern", sums((u) => GROUP_OF.has(u) ? DATA.groups[GROUP_OF.get(u)].pattern : "(no group)")),
    ...table("per op", sums((u) => T[u].op + (T[u].op === "mul_mat" ? " " + T[T[u].src[0]].type : ""))),
    ...table("slowest nodes", sums((u) => u).slice(0, 25), (u) => label(u) + " (" + T[u].op + ")"));
  }

  // ---------------------------------------------------------------------------------------
  // tools
  $("expand-all").addEventListener("click", () => {
    const s = current;
    for (const u of s.uids) {
      if (T[u].layer !== undefined) s.openLayers.add(T[u].layer);
      if (GROUP_OF.has(u)) s.openGroups.add(GROUP_OF.get(u));
    }
    s.transform = null;
    render(s);
  });
  $("collapse-all").addEventListener("click", () => {
    current.openLayers.clear(); current.openGroups.clear(); current.transform = null; render(current);
  });
  $("fit").addEventListener("click", () => { current.transform = fitTransform(current.size.width, current.size.height); applyTransform(current); });
  $("heat").addEventListener("change", () => render(current));
  if (!HAS_PROFILE) $("heat-label").style.display = "none";
  heatMax = Math.max(0, ...DATA.groups.map((g) => g.nodes.reduce((a, u) => a + timeOf(u), 0)),
    ...DATA.graph.order.map(timeOf));

  // ---------------------------------------------------------------------------------------
  // start: the optimised graph, every layer and group collapsed
  $("title").textContent = DATA.meta.title;
  buildStageBar();
  const tParsed = performance.now();
  showTab("graph");
  const tReady = performance.now();
  // for tests and benchmarks (tests/ggmlpy/viz): what is drawn, and how long the start took
  window.ggmlpyViz = {
    timing: { parse_ms: tParsed - t0, first_render_ms: tReady - tParsed, ready_ms: tReady },
    activate, reveal, showTab, showStage, search,
    scene: () => current,
    visibleCount: () => document.querySelectorAll("#viewport g.node").length,
  };
  document.body.dataset.ready = "1";
})();
