// Lockstep's read-only page: polls the JSON endpoints of app/http/ui.py and draws them.
// Plain DOM, no framework and no build step. Text goes in through textContent only.
"use strict";

const POLL_MS = 2000;
const STATES = ["partial", "timed out", "waiting", "binding", "admitted", "running", "invalid"];
const ui = { ns: "", state: "", rack: null, timer: null, seq: 0 };

function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "onclick" || k === "onchange") el[k] = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

async function get(path) {
  const r = await fetch(path, { cache: "no-store" });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

function slug(s) { return s.replace(/\s+/g, "-"); }
function stateTag(s) { return h("span", { class: `state st-${slug(s)}`, "data-state": s }, s); }
function age(sec) {
  if (sec === null || sec === undefined) return "-";
  if (sec < 120) return `${sec}s`;
  if (sec < 7200) return `${Math.floor(sec / 60)}m`;
  if (sec < 172800) return `${Math.floor(sec / 3600)}h`;
  return `${Math.floor(sec / 86400)}d`;
}
function hue(text) {
  let x = 0;
  for (const c of text) x = (x * 31 + c.charCodeAt(0)) >>> 0;
  return x % 360;
}
function gangLink(g) {
  return h("a", { href: `#/gang/${encodeURIComponent(g.namespace)}/${encodeURIComponent(g.name)}` },
           g.gang);
}

// ------------------------------------------------------------------ overview

function gangsSection(data) {
  const chips = h("div", { class: "chips", id: "state-chips" },
    h("span", { class: "chip" + (ui.state ? "" : " on"), "data-state": "",
                onclick: () => { ui.state = ""; refresh(); } }, "all", h("b", {}, data.total)),
    STATES.map((s) => h("span", {
      class: `chip s-${slug(s)}` + (ui.state === s ? " on" : ""), "data-state": s,
      "data-count": data.counts[s], onclick: () => { ui.state = s; refresh(); },
    }, s, h("b", {}, data.counts[s]))));
  const ns = h("select", { id: "ns-filter", onchange: (e) => { ui.ns = e.target.value; refresh(); } },
    h("option", { value: "" }, "all namespaces"),
    data.namespaces.map((n) => h("option", { value: n, selected: n === ui.ns }, n)));
  const rows = data.gangs.map((g) => h("tr", { "data-gang": g.gang, "data-state": g.state },
    h("td", {}, gangLink(g)), h("td", {}, stateTag(g.state)),
    h("td", { class: "num" }, g.minMember ?? "-"), h("td", { class: "num" }, g.members),
    h("td", { class: "num", "data-col": "bound" }, g.bound),
    h("td", { class: "num", "data-col": "parked" }, g.parked),
    h("td", { class: "num", "data-col": "pending" }, g.pending),
    h("td", {}, g.convention ?? "-"), h("td", { class: "num" }, g.priority),
    h("td", { class: "num" }, age(g.ageSeconds)),
    h("td", { class: "reason" }, g.reason ?? "")));
  const shown = data.matching > data.gangs.length
    ? h("p", { class: "note" }, `showing ${data.gangs.length} of ${data.matching} (worst state first)`)
    : null;
  return h("section", { id: "gangs" }, h("h2", {}, "Gangs"), chips,
    h("div", {}, "Namespace ", ns),
    h("table", {}, h("thead", {}, h("tr", {}, ["gang", "state", "min", "members", "bound",
      "parked", "pending", "convention", "priority", "age", "why it waits"].map((c) => h("th", {}, c)))),
      h("tbody", { id: "gang-rows" }, rows)),
    rows.length ? null : h("p", { class: "note" }, "no gangs"), shown);
}

function bar(used, reserved, total) {
  const pct = (n) => total ? `${(100 * n / total).toFixed(1)}%` : "0";
  return h("div", { class: "bar" }, h("span", { class: "u", style: `width:${pct(used)}` }),
           h("span", { class: "r", style: `width:${pct(reserved)}` }));
}

function legend() {
  return h("div", { class: "legend" },
    h("span", {}, h("span", { class: "gpu used" }), "used"),
    h("span", {}, h("span", { class: "gpu reserved", style: "background:hsl(30 80% 60%)" }),
      "reserved for a gang (colour per gang, name on hover)"),
    h("span", {}, h("span", { class: "gpu" }), "free"),
    h("span", {}, h("span", { class: "island" }, h("span", { class: "gpu" }), h("span", { class: "gpu" })),
      "NVLink island"),
    h("span", {}, h("span", { class: "gpu numa1" }), "second NUMA side (dark underline)"),
    h("span", {}, "dashed box: NVSwitch domain across nodes"));
}

function capacitySection(data) {
  const t = data.totals;
  const tiles = data.racks.map((r) => h("div", {
    class: "rack" + (ui.rack === r.rack ? " open" : ""), "data-rack": r.rack,
    title: Object.keys(r.reservedFor).length
      ? "reserved for " + Object.entries(r.reservedFor).map(([g, n]) => `${g} (${n})`).join(", ") : "",
    onclick: () => { ui.rack = ui.rack === r.rack ? null : r.rack; refresh(); },
  }, h("b", {}, r.name), ` ${r.nodes} nodes`, bar(r.used, r.reserved, r.gpus),
     `${r.used} used · ${r.reserved} reserved · ${r.free} free`));
  return h("section", { id: "capacity" },
    h("h2", {}, `Capacity by ${data.level}`),
    h("p", { class: "note" }, `${t.nodes} nodes, ${t.gpus} GPUs: ${t.used} used, ${t.reserved} ` +
      `reserved for gangs. Click a ${data.level} to see its nodes.`),
    h("div", { class: "racks" }, tiles), h("div", { id: "rack-detail" }));
}

function gpuSlots(n) {
  const islands = [];
  let i = 0;
  const numaEnd = n.numa.length > 1 ? n.numa[0] : Infinity;
  for (const size of n.islands) {
    const box = h("span", { class: "island" });
    for (let k = 0; k < size && i < n.slots.length; k++, i++) {
      const [state, owner] = n.slots[i];
      const attrs = { class: `gpu ${state}` + (i >= numaEnd ? " numa1" : ""), "data-state": state };
      if (state === "reserved") {
        attrs.style = `background:hsl(${hue(owner)} 75% 60%)`;
        attrs.title = `GPU ${i}: reserved for gang ${owner}`;
        attrs["data-owner"] = owner;
      } else if (state === "used") {
        attrs.title = `GPU ${i}: used by ${owner}`;
        attrs["data-owner"] = owner;
      } else attrs.title = `GPU ${i}: free`;
      box.append(h("span", attrs));
    }
    islands.push(box);
  }
  return islands;
}

function rackDetail(data) {
  const byClique = new Map();
  for (const n of data.nodes) {
    const key = n.nvswitchDomain || "";
    if (!byClique.has(key)) byClique.set(key, []);
    byClique.get(key).push(n);
  }
  const groups = [];
  for (const [clique, nodes] of byClique) {
    const lines = nodes.map((n) => h("div", { class: "node", "data-node": n.node },
      h("span", { class: "name", title: n.node }, n.node), gpuSlots(n),
      h("span", { class: "note" }, [n.interconnect, n.unschedulable ? "cordoned" : ""]
        .filter(Boolean).join(" · "))));
    groups.push(clique ? h("div", { class: "clique", "data-clique": clique },
      h("div", { class: "label" }, `NVSwitch domain ${clique}`), lines) : h("div", {}, lines));
  }
  return h("div", {}, h("h2", {}, `${data.level} ${data.rack}`), legend(),
           h("div", { class: "nodes" }, groups));
}

function preemptionsSection(list) {
  if (!list || !list.length) return null;
  const rows = list.map((p) => h("tr", { "data-preemptor": p.preemptor },
    h("td", {}, gangLink({ gang: p.preemptor, namespace: p.preemptor.split("/")[0],
                           name: p.preemptor.split("/").slice(1).join("/") })),
    h("td", { class: "num" }, p.priority),
    h("td", {}, [...p.victimGangs, p.plainPods ? `${p.plainPods} plain pod(s)` : null]
      .filter(Boolean).join(", ")),
    h("td", { class: "num" }, p.gpus), h("td", { class: "num" }, `${p.waitingFor}/${p.victimPods}`),
    h("td", { class: "num" }, age(p.ageSeconds))));
  return h("section", { id: "preemptions" }, h("h2", {}, "Preemptions in flight"),
    h("table", {}, h("thead", {}, h("tr", {}, ["preemptor", "priority", "evicting", "GPUs",
      "pods left", "age"].map((c) => h("th", {}, c)))), h("tbody", {}, rows)));
}

async function overview(seq) {
  const q = new URLSearchParams();
  if (ui.ns) q.set("namespace", ui.ns);
  if (ui.state) q.set("state", ui.state);
  const [gangs, racks, rack] = await Promise.all([
    get(`ui/api/gangs?${q}`), get("ui/api/racks"),
    ui.rack !== null ? get(`ui/api/rack?rack=${encodeURIComponent(ui.rack)}`).catch(() => null)
                     : Promise.resolve(null)]);
  if (seq !== ui.seq) return;
  const view = h("div", {}, gangsSection(gangs), preemptionsSection(gangs.preemptions),
                 capacitySection(racks));
  if (rack) view.querySelector("#rack-detail").append(rackDetail(rack));
  swap(view);
}

// ------------------------------------------------------------------ one gang

async function gangPage(seq, ns, name) {
  const g = await get(`ui/api/gang/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`);
  if (seq !== ui.seq) return;
  const plan = g.plan.length ? h("table", { id: "plan" },
    h("thead", {}, h("tr", {}, ["member", "node", "GPUs", g.placedWithin || "domain", "why this node"]
      .map((c) => h("th", {}, c)))),
    h("tbody", {}, g.plan.map((p) => h("tr", { "data-pod": p.pod },
      h("td", {}, p.pod), h("td", {}, p.node), h("td", { class: "num" }, p.gpus),
      h("td", {}, p.domain ?? "-"), h("td", { class: "reason" }, p.why)))))
    : h("p", { class: "note" }, "no reservation held");
  const members = h("table", { id: "members" },
    h("thead", {}, h("tr", {}, ["pod", "rank", "state", "node", "planned", "GPUs", "priority", "phase"]
      .map((c) => h("th", {}, c)))),
    h("tbody", {}, g.memberPods.map((m) => h("tr", { "data-pod": m.pod, "data-state": m.state },
      h("td", {}, m.pod), h("td", { class: "num" }, m.rank ?? "-"), h("td", {}, m.state),
      h("td", {}, m.node ?? "-"),
      h("td", {}, m.planned ?? "-"), h("td", { class: "num" }, m.gpus),
      h("td", { class: "num" }, m.priority), h("td", {}, m.phase)))));
  const events = g.events.length ? h("table", { id: "events" },
    h("thead", {}, h("tr", {}, ["time", "type", "reason", "pod", "message"].map((c) => h("th", {}, c)))),
    h("tbody", {}, g.events.slice().reverse().map((e) => h("tr", {},
      h("td", {}, e.lastTimestamp), h("td", {}, e.type), h("td", {}, e.reason),
      h("td", {}, e.pod), h("td", { class: "reason" }, e.message)))))
    : h("p", { class: "note" }, "no Events posted by this Lockstep for it yet");
  swap(h("div", { id: "gang-page", "data-gang": g.gang },
    h("p", {}, h("a", { href: "#/" }, "← all gangs")),
    h("h2", {}, `Gang ${g.gang} `, stateTag(g.state)),
    h("dl", {},
      h("dt", {}, "members"), h("dd", {}, `${g.members} (min ${g.minMember ?? "-"}): ${g.bound} bound, ` +
        `${g.parked} parked, ${g.pending} pending`),
      h("dt", {}, "convention"), h("dd", {}, g.convention ?? "-"),
      h("dt", {}, "priority"), h("dd", {}, g.priority),
      h("dt", {}, "age"), h("dd", {}, age(g.ageSeconds)),
      h("dt", {}, "deadline"), h("dd", {}, g.deadlineInSeconds === null ? "-" : `${g.deadlineInSeconds}s`),
      h("dt", {}, "why"), h("dd", { id: "gang-reason" }, g.reason ?? "-")),
    h("h2", {}, "Plan"), h("p", { id: "plan-why" }, g.planWhy), plan,
    h("h2", {}, "Members"), members,
    h("h2", {}, "Events"), events));
}

// ------------------------------------------------------------------ would it fit?

function whatIfPage() {
  const text = h("textarea", { id: "whatif-manifest", rows: 16, spellcheck: "false",
    placeholder: "Paste a manifest: pods, a Job, a Deployment, a PyTorchJob with its " +
                 "PodGroup, a Volcano PodGroup, a Kueue Workload (YAML, --- between objects)" });
  const file = h("input", { type: "file", id: "whatif-file", accept: ".yaml,.yml,.json",
    onchange: async (e) => { const f = e.target.files[0]; if (f) text.value = await f.text(); } });
  const out = h("div", { id: "whatif-answer" });
  const ask = h("button", { id: "whatif-ask", onclick: () => askWhatIf(text.value, out) },
                "Would it fit?");
  swap(h("div", { id: "whatif-page" },
    h("p", {}, h("a", { href: "#/" }, "← all gangs")),
    h("h2", {}, "Would it fit?"),
    h("p", { class: "note" }, "A dry plan against what Lockstep holds now: nothing is " +
      "created, nothing reserved. The same answer as lockstep explain --what-if FILE."),
    h("p", {}, "Upload ", file, " or paste:"), text, h("p", {}, ask), out));
}

async function askWhatIf(manifest, out) {
  out.replaceChildren(h("p", { class: "note" }, "asking..."));
  delete document.body.dataset.whatif;
  let r, body;
  try {
    r = await fetch("debug/what-if", { method: "POST", body: manifest, cache: "no-store",
                                        headers: { "Content-Type": "application/yaml" } });
    body = await r.json();
  } catch (e) {
    out.replaceChildren(h("p", { class: "err", id: "whatif-error" }, `cannot ask: ${e.message}`));
    document.body.dataset.whatif = "error";
    return;
  }
  if (!r.ok) {
    out.replaceChildren(h("p", { class: "err", id: "whatif-error" }, body.error || r.statusText));
    document.body.dataset.whatif = "error";
    return;
  }
  out.replaceChildren(
    h("h2", { id: "whatif-verdict", "data-verdict": body.verdict }, body.verdict),
    ...body.outcomes.map(outcomeView),
    ...body.notes.map((n) => h("p", { class: "note" }, n)),
    h("details", {}, h("summary", {}, "as text"), h("pre", { id: "whatif-text" }, body.text)));
  document.body.dataset.whatif = body.verdict;
}

function outcomeView(o) {
  const rows = o.placed.map((p) => h("tr", { "data-pod": p.pod, "data-node": p.node },
    h("td", {}, p.pod), h("td", {}, p.node), h("td", {}, p.topology.rack ?? "-"),
    h("td", {}, p.topology.clique ?? "-"),
    h("td", {}, p.pinnedAtCreation ? "pinned at creation" : (o.gang ? "gated, then placed" :
                                                                 "kube-scheduler's choice"))));
  const v = o.victims;
  return h("section", { class: "whatif-unit", "data-unit": o.unit, "data-verdict": o.verdict },
    h("h2", {}, `${o.gang ? "gang" : "pod"} ${o.unit} (${o.members} pods): ${o.verdict}`,
      o.placedWithin ? `, within one ${o.placedWithin === "hostname" ? "node" : o.placedWithin}`
                     : ""),
    rows.length ? h("table", { class: "whatif-placed" },
      h("thead", {}, h("tr", {}, ["member", "node", "rack", "clique", "at creation"]
        .map((c) => h("th", {}, c)))), h("tbody", {}, rows)) : null,
    v ? h("p", { class: "whatif-victims" }, `evicts ${[...v.gangs.map((g) => "gang " + g),
      ...v.pods.map((p) => "pod " + p)].join(", ")} (${v.evicted} pods), freeing ` +
      `${v.gpusFreed} GPUs`) : null,
    o.reason ? h("p", { class: "reason" }, `why: ${o.reason}`) : null,
    o.hints.map((t) => h("p", { class: "reason" }, `would fit with: ${t}`)),
    o.earliest ? h("p", { class: "reason" },
      `earliest: in ${o.earliest.inSeconds} s, when ${o.earliest.event}`) : null);
}

// ------------------------------------------------------------------ loop

function swap(view) {
  const main = document.getElementById("view");
  main.replaceChildren(view);
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  document.body.dataset.loaded = String(ui.seq);
}

async function refresh() {
  clearTimeout(ui.timer);
  const seq = ++ui.seq;
  if (location.hash === "#/what-if") {  // a form: drawn once, never polled over
    whatIfPage();
    return;
  }
  const m = location.hash.match(/^#\/gang\/([^/]+)\/([^/]+)$/);
  try {
    if (m) await gangPage(seq, decodeURIComponent(m[1]), decodeURIComponent(m[2]));
    else await overview(seq);
  } catch (e) {
    if (seq === ui.seq) swap(h("p", { class: "err" }, `cannot load: ${e.message}`));
  }
  if (seq === ui.seq) ui.timer = setTimeout(refresh, POLL_MS);
}

window.addEventListener("hashchange", refresh);
refresh();
