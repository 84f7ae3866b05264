// The gridstream console: polls api/state about once a second and redraws.
// No framework and no build step; every value goes in through textContent.
"use strict";

const POLL_MS = 1000;
const SVG = "http://www.w3.org/2000/svg";
const palette = new Map();

function el(tag, attrs, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4))
    : document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== undefined && value !== null) node.setAttribute(name, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fill(id, nodes, empty) {
  const target = document.getElementById(id);
  target.replaceChildren(...(nodes.length ? nodes : [el("li", { class: "none" }, empty)]));
}

function clock(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleTimeString() : "—";
}

function num(value, digits) {
  if (value === null || value === undefined) return "∞";
  return Number(value).toLocaleString(undefined, { maximumFractionDigits: digits || 0 });
}

function colour(node) {
  if (!node) return "cx";
  if (!palette.has(node)) palette.set(node, "c" + (palette.size % 8));
  return palette.get(node);
}

function renderWarnings(state) {
  document.getElementById("warning-count").textContent = String(state.warnings.length);
  fill("warnings", state.warnings.map((w) => el("li", {
    class: "warning", "data-kind": w.kind, "data-job": w.job_id, "data-node": w.node_id,
  }, el("span", { class: "kind" }, w.kind), w.text, " ", el("span", { class: "muted" },
    "since " + clock(w.since)), el("span", { class: "action" }, "→ " + w.action))),
  "no warnings");
}

function renderMembers(state) {
  const rows = state.members.map((m) => el("tr", { "data-node": m.node_id, "data-state": m.state },
    el("td", {}, m.node_id), el("td", {}, m.role),
    el("td", { class: "state state-" + m.state }, m.state),
    el("td", {}, num(m.phi, 2)), el("td", {}, num(m.heartbeat_age_s, 2) + " s ago"),
    el("td", {}, num(m.loop_lag_s, 2) + " s"),
    el("td", {}, m.role === "worker" ? num(m.partitions) : "—"), el("td", {}, m.address)));
  document.getElementById("members").replaceChildren(...rows);
}

function renderRing(state) {
  const blocks = state.ring.map((job) => {
    const shares = new Map();
    const cells = job.owners.map((owner, p) => {
      shares.set(owner, (shares.get(owner) || 0) + 1);
      return el("div", { class: "cell " + colour(owner), title: `partition ${p} → ${owner}`,
        "data-partition": p, "data-owner": owner }, p);
    });
    const legend = [...shares.entries()].sort().map(([owner, count]) => el("span", {},
      el("span", { class: "swatch " + colour(owner) }), `${owner}: ${count}`));
    return el("div", { class: "ring-job", "data-job": job.job_id },
      el("strong", {}, job.job_id), " ", el("span", { class: "muted" },
        `${job.partitions} partitions, ${job.delivery}`),
      el("div", { class: "cells" }, ...cells), el("div", { class: "legend" }, ...legend));
  });
  document.getElementById("ring").replaceChildren(...(blocks.length ? blocks
    : [el("p", { class: "none" }, "no running jobs")]));
}

function spark(points, index, cls, since, until) {
  const svg = el("svg:svg", { class: "spark", viewBox: "0 0 220 34", preserveAspectRatio: "none" });
  const top = Math.max(1, ...points.map((p) => p[index]));
  const span = Math.max(1, until - since);
  const coords = points.map((p) => `${(((p[0] - since) / span) * 220).toFixed(1)},` +
    `${(32 - (p[index] / top) * 30).toFixed(1)}`);
  if (coords.length) svg.append(el("svg:polyline", { class: cls, points: coords.join(" ") }));
  svg.append(el("svg:title", {}, `max ${num(top)}`));
  return svg;
}

function renderStages(state) {
  document.getElementById("window").textContent =
    `(last ${Math.round(state.window_s / 60)} min, a sample every ${state.sample_s} s)`;
  const blocks = state.jobs.map((job) => {
    const first = Math.min(...job.stages.map((s) => (s.points[0] || [state.now])[0]));
    const since = Math.max(state.now - state.window_s, Math.min(first, state.now - 60));
    const rows = job.stages.map((stage) => {
      const last = stage.points[stage.points.length - 1] || [0, 0, 0, 0];
      return el("tr", { "data-task": stage.task },
        el("td", {}, stage.task), el("td", {}, stage.name),
        el("td", {}, num(last[1])), el("td", {}, num(last[2])), el("td", {}, num(last[3])),
        el("td", {}, spark(stage.points, 1, "rate", since, state.now)),
        el("td", {}, spark(stage.points, 3, "lag", since, state.now)));
    });
    const drained = job.drained ? "drained" : `not drained: ${job.holding || "?"}`;
    return el("div", { class: "stage-job", "data-job": job.job_id },
      el("strong", {}, job.job_id), " ", el("span", { class: "muted" }, drained),
      el("table", {}, el("thead", {}, el("tr", {}, ...["task", "stages", "records/s", "queued",
        "lag (records)", "throughput", "lag"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...rows)));
  });
  document.getElementById("stages").replaceChildren(...(blocks.length ? blocks
    : [el("p", { class: "none" }, "no running jobs")]));
}

function renderRecoveries(state) {
  fill("recoveries", state.recoveries.map((r) => {
    const steps = [["resumed", r.resumed_after_s], ["rejoined", r.rejoined_after_s],
      ["healthy", r.healthy_after_s]].map(([name, after]) =>
      after === null ? `${name} …` : `${name} +${num(after, 1)} s`);
    return el("li", { class: "recovery", "data-node": r.node_id, "data-phase": r.phase },
      el("strong", {}, r.node_id), ` declared dead at ${clock(r.detected_at)} (${r.reason}, ` +
      `phi ${num(r.phi, 1)}, epoch ${r.epoch}) → ${steps.join(" → ")} `,
      el("span", { class: "phase" }, r.phase));
  }), "no failures so far");
  const svg = document.getElementById("timeline");
  const since = state.now - state.window_s;
  const x = (t) => Math.max(0, Math.min(600, ((t - since) / state.window_s) * 600));
  const marks = [el("svg:line", { x1: 0, y1: 30, x2: 600, y2: 30 })];
  state.recoveries.forEach((r, i) => {
    const y = 8 + (i % 4) * 12;
    const end = r.healthy_at || r.resumed_at || state.now;
    marks.push(el("svg:rect", { class: r.healthy_at ? "heal" : "resume", x: x(r.detected_at),
      y, width: Math.max(2, x(end) - x(r.detected_at)), height: 8 },
      el("svg:title", {}, `${r.node_id}: ${r.phase}`)));
    marks.push(el("svg:rect", { class: "detect", x: x(r.detected_at), y: y - 2, width: 3,
      height: 12 }, el("svg:title", {}, `${r.node_id} declared dead ${clock(r.detected_at)}`)));
  });
  svg.replaceChildren(...marks);
}

function renderRoots(state) {
  document.getElementById("roots").replaceChildren(...state.jobs.map((job) => el("tr",
    { "data-job": job.job_id }, el("td", {}, job.job_id), el("td", {}, num(job.roots.pending)),
    el("td", {}, num(job.roots.failed)), el("td", {}, num(job.roots.finished)),
    el("td", {}, num(job.roots.abandoned)), el("td", {}, num(job.roots.batches_lost)),
    el("td", {}, num(job.roots.replayed_batches)))));
}

function renderEvents(state) {
  fill("events", state.events.slice().reverse().map((e) => el("li",
    { class: "event", "data-node": e.node_id, "data-new": e.new },
    `${clock(e.at)} ${e.node_id}: ${e.old} → ${e.new} (${e.reason}, phi ${num(e.phi, 1)}, ` +
    `epoch ${e.epoch})`)), "none");
}

function renderDead(state) {
  const blocks = state.jobs.filter((job) => job.dead_letters.count || job.dead_letters.error)
    .map((job) => {
      const d = job.dead_letters;
      const text = (v) => (typeof v === "string" ? v : JSON.stringify(v));
      const rows = d.letters.slice().reverse().map((l) => el("tr", {},
        el("td", {}, l.stage), el("td", { class: "record" }, text(l.record)),
        el("td", { class: "error", title: l.traceback || "" }, l.error),
        el("td", { class: "muted" }, l.id)));
      return el("div", { class: "dead-job", "data-job": job.job_id },
        el("strong", {}, job.job_id), ` ${num(d.count)} records (${num(d.stored)} stored; ` +
        `the newest below; all: gridstream dead-letters ${job.job_id}) `,
        d.error ? el("span", { class: "state-dead" }, d.error) : null,
        el("table", {}, el("thead", {}, el("tr", {}, ...["stage", "record", "error", "id"]
          .map((h) => el("th", {}, h)))), el("tbody", {}, ...rows)));
    });
  document.getElementById("dead").replaceChildren(...(blocks.length ? blocks
    : [el("p", { class: "none" }, "none")]));
}

function render(state) {
  document.getElementById("epoch").textContent = `epoch ${state.epoch}`;
  document.getElementById("updated").textContent = `sampled ${clock(state.sampled_at)}`;
  for (const part of [renderWarnings, renderMembers, renderRing, renderStages,
    renderRecoveries, renderRoots, renderEvents, renderDead]) {
    part(state);
  }
}

function connection(ok, text) {
  const node = document.getElementById("connection");
  node.dataset.ok = String(ok);
  node.textContent = text;
}

async function poll() {
  try {
    const response = await fetch("api/state", { credentials: "same-origin", cache: "no-store" });
    if (response.status === 401) {
      connection(false, "401: open this page with ?token=<a token with the read right>");
    } else if (!response.ok) {
      connection(false, `the scheduler answered ${response.status}`);
    } else {
      render(await response.json());
      connection(true, "live");
    }
  } catch (error) {
    connection(false, `scheduler unreachable (${error.message})`);
  }
  setTimeout(poll, POLL_MS);
}

poll();
