"""The page ``collcomm explain --out F.html`` writes (self-contained: no network).

``__TITLE__``, ``__SUMMARY__`` and ``__DATA__`` (the explanation as JSON) are filled in by
:func:`collcomm.tools.explain_render.html`. A Python module rather than a data file, so
every kind of install carries it.
"""

PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>__TITLE__</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 16px; color: #222; }
  h1 { font-size: 18px; margin: 0 0 8px 0; }
  pre { background: #f6f6f6; padding: 8px; font-size: 12px; white-space: pre-wrap; }
  #controls button { font-size: 14px; margin-right: 4px; min-width: 36px; }
  #frameLabel { font-weight: bold; margin-left: 12px; }
  #errors { color: #b00020; white-space: pre-wrap; }
  .legend span { display: inline-block; padding: 1px 6px; margin-right: 8px; border: 1px solid #888; font-size: 12px; }
</style>
</head>
<body>
<h1>__TITLE__</h1>
<div id="controls">
  <button id="first" title="first frame">«</button>
  <button id="prev" title="previous step">◀</button>
  <button id="play" title="play / pause">▶</button>
  <button id="next" title="next step">▶|</button>
  <button id="last" title="last frame">»</button>
  <span id="frameLabel"></span>
</div>
<p class="legend">cells: the ranks whose contributions a chunk holds —
  <span style="background:#f2f2f2">· none</span><span style="background:#cfe8ff">some</span><span style="background:#4caf50">all</span><span style="border-color:#d32f2f">changed in this step</span>
  arrows: the messages of this step (sender → receiver, what it carried)</p>
<svg id="view" xmlns="http://www.w3.org/2000/svg" width="900" height="300"></svg>
<pre id="summary">__SUMMARY__</pre>
<div id="errors"></div>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
window.addEventListener("error", function (e) {
  document.getElementById("errors").textContent += "error: " + e.message + "\n";
});
const EX = JSON.parse(document.getElementById("data").textContent);
const NS = "http://www.w3.org/2000/svg";
const CW = 58, CH = 30, LEFT = 70, TOP = 10;
let frame = 0, timer = null;
const cols = Math.max(1, ...EX.frames.map(f => Math.max(0, ...f.rows.map(r => r.labels.length))));

function el(name, attrs, text) {
  const e = document.createElementNS(NS, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}

function isFull(label) {
  return EX.n > 1 && label !== "·" && (label === "all" || label.length >= Math.min(EX.n, 10)) && !label.includes("→");
}

function draw() {
  const f = EX.frames[frame];
  const svg = document.getElementById("view");
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const arrowsX = LEFT + cols * CW + 20;
  const width = arrowsX + 60 + 150;
  const height = TOP + EX.n * CH + 20;
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  const defs = el("defs", {});
  const marker = el("marker", {id: "head", markerWidth: 8, markerHeight: 8, refX: 7, refY: 4, orient: "auto"});
  marker.appendChild(el("path", {d: "M0,0 L8,4 L0,8 z", fill: "#1565c0"}));
  defs.appendChild(marker);
  svg.appendChild(defs);
  for (const row of f.rows) {
    const y = TOP + row.rank * CH;
    svg.appendChild(el("text", {x: 6, y: y + 19, "font-size": 13}, "rank " + row.rank));
    const changed = new Set(row.changed || []);
    row.labels.forEach(function (label, i) {
      const x = LEFT + i * CW;
      const fill = label === "·" ? "#f2f2f2" : (isFull(label) ? "#4caf50" : "#cfe8ff");
      svg.appendChild(el("rect", {x: x, y: y, width: CW - 6, height: CH - 6, rx: 3, fill: fill,
        stroke: changed.has(i) ? "#d32f2f" : "#888", "stroke-width": changed.has(i) ? 2.5 : 1,
        "class": "cell", "data-rank": row.rank, "data-chunk": i}));
      svg.appendChild(el("text", {x: x + 4, y: y + 17, "font-size": 12, "font-family": "monospace",
        "class": "label", "data-rank": row.rank, "data-chunk": i}, label));
    });
    if (row.sync) svg.appendChild(el("text", {x: arrowsX - 14, y: y + 18, "font-size": 11, fill: "#6a1b9a"}, "⟂"));
  }
  f.arrows.forEach(function (a, j) {
    const ya = TOP + a.from * CH + 12, yb = TOP + a.to * CH + 12;
    const bend = 18 + 14 * (Math.abs(a.to - a.from));
    svg.appendChild(el("path", {d: "M" + arrowsX + "," + ya + " C" + (arrowsX + bend) + "," + ya + " " +
      (arrowsX + bend) + "," + yb + " " + arrowsX + "," + (yb + 2), fill: "none", stroke: "#1565c0",
      "stroke-width": 1.5, "marker-end": "url(#head)", "class": "arrow",
      "stroke-dasharray": a.read ? "4 3" : "none"}));
    const what = a.read ? "reads slot" : (a.chunk === null ? "scratch" : "chunk " + a.chunk) + (a.label ? " [" + a.label + "]" : "");
    svg.appendChild(el("text", {x: arrowsX + bend + 6, y: (ya + yb) / 2 + 4, "font-size": 11, fill: "#1565c0"},
      "r" + a.from + "→r" + a.to + " " + what));
  });
  const label = frame === 0 ? "initial state" : "step " + frame + " of " + EX.steps;
  document.getElementById("frameLabel").textContent = label +
    (frame === EX.frames.length - 1 ? " — final: " + EX.final_text + (EX.final_ok ? " ✓" : " ✗") : "");
  document.body.dataset.frame = String(frame);
}

function go(i) { frame = Math.max(0, Math.min(EX.frames.length - 1, i)); draw(); }
function next() { go(frame + 1); }
function prev() { go(frame - 1); }
function play() {
  const button = document.getElementById("play");
  if (timer) { clearInterval(timer); timer = null; button.textContent = "▶"; return; }
  if (frame === EX.frames.length - 1) go(0);
  button.textContent = "⏸";
  timer = setInterval(function () {
    if (frame >= EX.frames.length - 1) { clearInterval(timer); timer = null; button.textContent = "▶"; return; }
    next();
  }, 900);
}
document.getElementById("first").onclick = function () { go(0); };
document.getElementById("prev").onclick = prev;
document.getElementById("next").onclick = next;
document.getElementById("last").onclick = function () { go(EX.frames.length - 1); };
document.getElementById("play").onclick = play;
document.addEventListener("keydown", function (e) {
  if (e.key === "ArrowRight") next();
  else if (e.key === "ArrowLeft") prev();
  else if (e.key === " ") { e.preventDefault(); play(); }
});
draw();
// #last: open on the final frame; #steps=K: press "next" K times (used by the tests)
const hash = window.location.hash;
if (hash === "#last") document.getElementById("last").click();
const m = /^#steps=(\d+)$/.exec(hash);
if (m) for (let i = 0; i < Number(m[1]); i++) document.getElementById("next").click();
document.body.dataset.ready = "1";
</script>
</body>
</html>
"""
