// bait-service dashboard: charts (Chart.js, vendored) fed by the JSON routes of /ui; live batch table by htmx.
"use strict";
(function () {
  const charts = {};
  const STATUS_COLOURS = { selected: "#d62728", labeled: "#2f6fdf", reserved: "#e0a100", validation: "#1f8a4c", unlabeled: "#c5cbd5" };
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

  function chart(id, config) {
    if (charts[id]) charts[id].destroy();
    const canvas = document.getElementById(id);
    if (!canvas || !window.Chart) return null;
    config.options = Object.assign({ animation: false, maintainAspectRatio: false, responsive: true }, config.options || {});
    charts[id] = new window.Chart(canvas, config);
    return charts[id];
  }

  async function getJSON(url) {
    const r = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!r.ok) return null;
    return r.json();
  }

  async function drawCurve() {
    const canvas = document.getElementById("curve");
    if (!canvas) return;
    const metricSel = document.getElementById("curve-metric");
    const metric = metricSel ? metricSel.value : "";
    const data = await getJSON(canvas.dataset.url + (metric ? "?metric=" + encodeURIComponent(metric) : ""));
    if (!data) return;
    const pts = data.points;
    document.getElementById("curve-count").textContent = String(pts.length);
    canvas.dataset.points = String(pts.length);
    const trainKey = data.task === "classification" ? (metric === "accuracy" ? "train_accuracy" : null) : (metric === "rmse" ? "train_rmse" : null);
    document.getElementById("curve-empty").hidden = pts.some((p) => p.value !== null);
    const stop = document.getElementById("stop");
    if (stop && data.stop) {
      stop.dataset.recommended = String(data.stop.recommended);
      stop.className = "stop " + (data.stop.recommended ? "stop-yes" : "stop-no");
      document.getElementById("stop-verdict").textContent = data.stop.recommended ? "Stopping recommended" : "Keep labeling";
      document.getElementById("stop-reason").textContent = data.stop.reason;
    }
    const datasets = [{
      label: "validation " + data.metric, borderColor: "#2f6fdf", backgroundColor: "#2f6fdf",
      data: pts.filter((p) => p.value !== null).map((p) => ({ x: p.n_labels, y: p.value, strategy: p.strategy, round: p.round })),
    }];
    if (trainKey) {
      datasets.push({
        label: "training " + data.metric, borderColor: "#9aa6b8", backgroundColor: "#9aa6b8", borderDash: [4, 4],
        data: pts.filter((p) => typeof p.training[trainKey] === "number").map((p) => ({ x: p.n_labels, y: p.training[trainKey], strategy: p.strategy, round: p.round })),
      });
    }
    chart("curve", {
      type: "line", data: { datasets },
      options: {
        parsing: false,
        scales: { x: { type: "linear", title: { display: true, text: "training labels" } }, y: { title: { display: true, text: data.metric } } },
        plugins: { tooltip: { callbacks: { afterLabel: (c) => "round " + c.raw.round + ", labels chosen by " + c.raw.strategy } } },
      },
    });
  }

  let lastMap = null;
  function colourKey(mode, i, pts) {
    if (mode === "status") return pts.status[i];
    const v = mode === "label" ? pts.label[i] : pts.predicted[i];
    return v === null || v === undefined ? "(none)" : String(v);
  }

  function drawMap() {
    const data = lastMap;
    if (!data) return;
    const sel = document.getElementById("map-colour");
    const mode = sel ? sel.value : "status";
    const pts = data.points;
    const groups = new Map();
    for (let i = 0; i < pts.x.length; i++) {
      const key = colourKey(mode, i, pts);
      if (!groups.has(key)) groups.set(key, { plain: [], selected: [] });
      (pts.status[i] === "selected" ? groups.get(key).selected : groups.get(key).plain).push({ x: pts.x[i], y: pts.y[i] });
    }
    const classes = data.classes || [];
    const colour = (key) => mode === "status" ? (STATUS_COLOURS[key] || "#999") : (key === "(none)" ? "#d8dde5" : PALETTE[Math.max(0, classes.indexOf(key)) % PALETTE.length]);
    const datasets = [];
    const highlight = [];
    for (const [key, g] of groups) {
      if (g.plain.length) datasets.push({ label: key, data: g.plain, backgroundColor: colour(key), pointRadius: 1.6, order: key === "unlabeled" || key === "(none)" ? 3 : 2 });
      if (g.selected.length) highlight.push(...g.selected);
    }
    if (highlight.length) datasets.push({ label: "latest batch", data: highlight, backgroundColor: "#d62728", borderColor: "#000", borderWidth: 1, pointRadius: 4, pointStyle: "rectRot", order: 0 });
    document.getElementById("map-info").textContent = "(round " + data.round + ", " + data.n_points + " of " + data.total + " items)";
    chart("map", { type: "scatter", data: { datasets }, options: { parsing: false, normalized: true, plugins: { tooltip: { enabled: false } }, scales: { x: { display: false }, y: { display: false } } } });
  }

  function drawClasses() {
    const canvas = document.getElementById("classes");
    if (!canvas) return;
    const labels = JSON.parse(canvas.dataset.labels || "[]");
    const names = labels.map((l) => l.label);
    const datasets = [{ label: "labeled (train)", data: labels.map((l) => l.count), backgroundColor: "#2f6fdf" }];
    if (lastMap) {
      const counts = new Map(names.map((n) => [n, 0]));
      const pts = lastMap.points;
      for (let i = 0; i < pts.status.length; i++) if (pts.status[i] === "selected" && counts.has(pts.predicted[i])) counts.set(pts.predicted[i], counts.get(pts.predicted[i]) + 1);
      datasets.push({ label: "latest batch (predicted)", data: names.map((n) => counts.get(n)), backgroundColor: "#d62728" });
    }
    chart("classes", { type: "bar", data: { labels: names, datasets } });
  }

  async function loadMap() {
    const canvas = document.getElementById("map");
    if (!canvas) return;
    lastMap = await getJSON(canvas.dataset.url);
    document.getElementById("map-empty").hidden = !!lastMap;
    drawMap();
    drawClasses();
  }

  function refreshAll() { drawCurve(); loadMap(); }

  document.addEventListener("DOMContentLoaded", function () {
    refreshAll();
    drawClasses();
    const metric = document.getElementById("curve-metric");
    if (metric) metric.addEventListener("change", drawCurve);
    const colour = document.getElementById("map-colour");
    if (colour) colour.addEventListener("change", drawMap);
    // The batches table is swapped in every 2 s; when a batch has finished with a new head, redraw the charts.
    const initial = document.getElementById("batches-table");
    let checkpoints = initial ? initial.dataset.checkpoints : null;
    document.body.addEventListener("htmx:afterSwap", function (ev) {
      if (!ev.detail || !ev.detail.target || ev.detail.target.id !== "batches") return;
      const table = document.getElementById("batches-table");
      const now = table ? table.dataset.checkpoints : null;
      if (checkpoints !== null && now !== checkpoints) refreshAll();
      checkpoints = now;
    });
  });
})();
