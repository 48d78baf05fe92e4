// Small line charts in inline SVG: no library. ``series`` is a list of {points: [[t, y], ...], cls, label}.

const NS = "http://www.w3.org/2000/svg";
const W = 600, H = 180, LEFT = 48, RIGHT = 8, TOP = 10, BOTTOM = 22;

function el(name, attrs, text) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function niceMax(v) {
  if (v <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function fmt(v) {
  if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
  return v % 1 ? v.toFixed(1) : String(v);
}

export function lineChart(svg, series, spanS) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const now = Date.now() / 1000;
  const t0 = now - spanS;
  let ymax = 0;
  for (const s of series) for (const [, y] of s.points) ymax = Math.max(ymax, y);
  ymax = niceMax(ymax);
  const x = (t) => LEFT + ((t - t0) / spanS) * (W - LEFT - RIGHT);
  const y = (v) => TOP + (1 - v / ymax) * (H - TOP - BOTTOM);
  for (const f of [0, 0.5, 1]) {
    const yy = y(ymax * f);
    svg.appendChild(el("line", { class: "axis", x1: LEFT, x2: W - RIGHT, y1: yy, y2: yy }));
    svg.appendChild(el("text", { x: LEFT - 4, y: yy + 4, "text-anchor": "end" }, fmt(ymax * f)));
  }
  for (const m of [15, 10, 5, 0]) {
    svg.appendChild(el("text", { x: x(now - m * 60), y: H - 6, "text-anchor": "middle" }, m ? `-${m} min` : "now"));
  }
  let lx = LEFT + 8;
  for (const s of series) {
    const pts = s.points.filter(([t]) => t >= t0).map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`);
    if (pts.length > 1) svg.appendChild(el("polyline", { class: s.cls, points: pts.join(" ") }));
    svg.appendChild(el("line", { class: s.cls, x1: lx, x2: lx + 18, y1: TOP + 4, y2: TOP + 4 }));
    const last = s.points.length ? s.points[s.points.length - 1][1] : 0;
    svg.appendChild(el("text", { x: lx + 22, y: TOP + 8 }, `${s.label} ${fmt(Math.round(last * 10) / 10)}`));
    lx += 150;
  }
}
