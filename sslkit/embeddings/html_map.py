"""A self-contained HTML map of an embedding: opens offline in any browser, no server, no CDN.

One file holds everything: the 2-D points, labels and item names as JSON, the thumbnails as one
PNG sprite sheet (base64), each point's nearest neighbours, and a page script of a hundred lines
that draws the points on a canvas. Hovering a point shows its image, label and item; clicking
one rings its neighbours and lists them with their cosine similarity (``map.html#pick=42`` opens
with item 42 picked); the wheel zooms and a drag pans. Nothing is fetched: the page works from a
USB stick or an e-mail attachment. Every name on it (file, class, folder) is data: carried as JSON
that no name can end (:func:`script_json`) and shown as text, so whatever a user's folder holds, the
page runs only its own script.

Why one sprite sheet and not one ``<img>`` per point: 10,000 data URLs make the page slow to
parse and to lay out; one image decoded once and drawn from by offset stays fast.

>>> write_html_map("map.html", points, items, labels, images, neighbours, similarities)  # doctest: +SKIP
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from pathlib import Path

import numpy as np

THUMBNAIL = 32  # pixels a side in the sprite sheet


def sprite_sheet(images: np.ndarray, size: int = THUMBNAIL) -> tuple[str, int]:
    """The images resized to ``size`` and tiled row by row into one PNG, base64; and its columns.

    Shape:
        images: (N, C, H, W) uint8, C = 1 or 3.
    """
    from PIL import Image

    columns = max(1, math.ceil(math.sqrt(len(images))))
    rows = max(1, math.ceil(len(images) / columns))
    mode = "L" if images.shape[1] == 1 else "RGB"
    sheet = Image.new(mode, (columns * size, rows * size))
    for i, image in enumerate(images):
        pixels = image[0] if mode == "L" else image.transpose(1, 2, 0)
        tile = Image.fromarray(np.ascontiguousarray(pixels), mode).resize((size, size), Image.BILINEAR)
        sheet.paste(tile, ((i % columns) * size, (i // columns) * size))
    buffer = io.BytesIO()
    sheet.save(buffer, format="PNG", optimize=True)
    return base64.b64encode(buffer.getvalue()).decode("ascii"), columns


def write_html_map(
    path: str | Path,
    points: np.ndarray,
    items: list[str],
    labels: np.ndarray | None = None,
    images: np.ndarray | None = None,
    neighbours: np.ndarray | None = None,
    similarities: np.ndarray | None = None,
    class_names: list[str] | None = None,
    title: str = "sslkit embedding map",
) -> Path:
    """Write the page to ``path``.

    Shape:
        points: (N, 2); labels: (N,) int or None; images: (N, C, H, W) uint8 or None;
        neighbours: (N, k) int row indices or None; similarities: (N, k) or None.
    """
    low, high = points.min(0), points.max(0)
    unit = (points - low) / np.maximum(high - low, 1e-12)  # the page maps [0, 1] to the canvas
    data = {
        "title": title,
        "x": np.round(unit[:, 0], 4).tolist(),
        "y": np.round(unit[:, 1], 4).tolist(),
        "items": list(items),
        "labels": None if labels is None else [int(v) for v in labels],
        "classNames": class_names,
        "neighbours": None if neighbours is None else np.asarray(neighbours).astype(int).tolist(),
        "similarities": None if similarities is None else np.round(np.asarray(similarities), 3).tolist(),
        "thumbnail": THUMBNAIL,
    }
    sprite, columns = sprite_sheet(images) if images is not None else ("", 0)
    data["spriteColumns"] = columns
    values = {"TITLE": html.escape(title, quote=False), "DATA": script_json(data), "SPRITE": sprite}
    # One pass: a value is never searched again, so a name holding "__SPRITE__" stays a name.
    page = _PLACEHOLDER.sub(lambda match: values[match.group(1)], _PAGE)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)
    return path


def script_json(data) -> str:
    """``data`` as JSON that can sit inside a ``<script>`` element whatever its strings hold.

    An HTML parser ends a script at the first ``</script`` and treats ``<!--`` specially, whatever
    JavaScript would make of them, so a file named ``a</script><script>...`` would end the page's script
    and start its own. JSON may write any character as ``\\uXXXX``: ``<``, ``>`` and ``&`` are written
    so (no tag, comment or entity can form), and so are U+2028 and U+2029, which JavaScript before
    ES2019 reads as line ends inside a string. The page reads the data back with ``JSON.parse``.
    """
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return text.translate(_SCRIPT_SAFE)


_SCRIPT_SAFE = {ord(c): f"\\u{ord(c):04x}" for c in "<>&\u2028\u2029"}
_PLACEHOLDER = re.compile(r"__(TITLE|DATA|SPRITE)__")


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { margin: 0; font: 13px system-ui, sans-serif; display: flex; height: 100vh; overflow: hidden; }
#map { flex: 1 1 0; min-width: 0; height: 100vh; display: block; cursor: crosshair; }
#side { flex: none; width: 260px; padding: 8px; border-left: 1px solid #ddd; overflow-y: auto;
        overflow-wrap: anywhere; }
#tip { position: fixed; pointer-events: none; background: #fff; border: 1px solid #888; padding: 4px;
       display: none; box-shadow: 0 1px 4px rgba(0,0,0,.3); }
.row { display: flex; align-items: center; gap: 6px; margin: 2px 0; }
canvas.thumb { width: 48px; height: 48px; image-rendering: pixelated; border: 1px solid #ccc; }
</style></head>
<body><canvas id="map"></canvas>
<div id="side"><b>__TITLE__</b><div id="legend"></div><hr>
<div id="picked">Click a point to see its neighbours.</div></div>
<div id="tip"></div>
<img id="sprite" style="display:none" alt="" src="data:image/png;base64,__SPRITE__">
<script id="map-data" type="application/json">__DATA__</script>
<script>
const D = JSON.parse(document.getElementById("map-data").textContent);
const N = D.x.length, canvas = document.getElementById("map"), ctx = canvas.getContext("2d");
const tip = document.getElementById("tip"), sprite = document.getElementById("sprite");
const palette = ["#1f77b4","#ff7f0e","#2ca02c","#d62728","#9467bd","#8c564b","#e377c2","#7f7f7f","#bcbd22",
                 "#17becf","#393b79","#637939","#8c6d31","#843c39","#7b4173","#3182bd","#e6550d","#31a354"];
let view = {scale: 1, dx: 0, dy: 0}, picked = -1;
function colour(i) { return D.labels ? palette[D.labels[i] % palette.length] : "#1f77b4"; }
function labelName(i) {
  if (!D.labels) return "";
  const l = D.labels[i];
  return D.classNames && D.classNames[l] !== undefined ? D.classNames[l] : String(l);
}
function screen(i) {
  const m = 20, w = canvas.width - 2 * m, h = canvas.height - 2 * m;
  return [m + (D.x[i] * w) * view.scale + view.dx, m + ((1 - D.y[i]) * h) * view.scale + view.dy];
}
function draw() {
  canvas.width = canvas.clientWidth; canvas.height = canvas.clientHeight;
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const r = Math.max(1.2, Math.min(4, 600 / Math.sqrt(N))) * Math.sqrt(view.scale);
  for (let i = 0; i < N; i++) {
    const [x, y] = screen(i);
    ctx.fillStyle = colour(i); ctx.fillRect(x - r, y - r, 2 * r, 2 * r);
  }
  if (picked >= 0 && D.neighbours) {
    ctx.lineWidth = 2; ctx.strokeStyle = "#000";
    for (const j of [picked, ...D.neighbours[picked]]) {
      const [x, y] = screen(j); ctx.beginPath(); ctx.arc(x, y, r + 5, 0, 2 * Math.PI); ctx.stroke();
    }
  }
  document.body.dataset.drawn = String(N);
}
function thumb(i) {
  const c = document.createElement("canvas"); c.className = "thumb";
  const t = D.thumbnail; c.width = t; c.height = t;
  if (D.spriteColumns) {
    const sx = (i % D.spriteColumns) * t, sy = Math.floor(i / D.spriteColumns) * t;
    c.getContext("2d").drawImage(sprite, sx, sy, t, t, 0, 0, t, t);
  }
  return c;
}
function nearestPoint(mx, my) {
  let best = -1, bestD = 64;
  for (let i = 0; i < N; i++) {
    const [x, y] = screen(i), d = (x - mx) ** 2 + (y - my) ** 2;
    if (d < bestD) { bestD = d; best = i; }
  }
  return best;
}
function describe(i) { return (labelName(i) ? labelName(i) + " \\u00b7 " : "") + D.items[i]; }
canvas.addEventListener("mousemove", (e) => {
  if (e.buttons) { view.dx += e.movementX; view.dy += e.movementY; draw(); return; }
  const i = nearestPoint(e.offsetX, e.offsetY);
  if (i < 0) { tip.style.display = "none"; return; }
  tip.replaceChildren(thumb(i), document.createElement("br"), document.createTextNode(describe(i)));
  tip.style.left = (e.clientX + 12) + "px"; tip.style.top = (e.clientY + 12) + "px"; tip.style.display = "block";
});
canvas.addEventListener("mouseleave", () => { tip.style.display = "none"; });
function pick(i) {
  picked = i;
  const box = document.getElementById("picked"); box.replaceChildren();
  if (picked < 0) return draw();
  const head = document.createElement("div"); head.className = "row";
  head.append(thumb(picked), document.createTextNode(describe(picked))); box.append(head);
  if (D.neighbours) {
    box.append(document.createTextNode("nearest:"));
    D.neighbours[picked].forEach((j, n) => {
      const row = document.createElement("div"); row.className = "row neighbour";
      row.append(thumb(j), document.createTextNode(D.similarities[picked][n].toFixed(3) + "  " + describe(j)));
      box.append(row);
    });
  }
  draw();
}
canvas.addEventListener("click", (e) => pick(nearestPoint(e.offsetX, e.offsetY)));
canvas.addEventListener("wheel", (e) => {
  e.preventDefault();
  const f = e.deltaY < 0 ? 1.25 : 0.8;
  view.dx = e.offsetX - (e.offsetX - view.dx) * f; view.dy = e.offsetY - (e.offsetY - view.dy) * f;
  view.scale *= f; draw();
}, {passive: false});
if (D.labels) {
  const seen = [...new Set(D.labels)].sort((a, b) => a - b), legend = document.getElementById("legend");
  for (const l of seen) {
    const row = document.createElement("div"); row.className = "row";
    const swatch = document.createElement("span");
    swatch.style.cssText = "display:inline-block;width:10px;height:10px;background:" + palette[l % palette.length];
    const name = D.classNames && D.classNames[l] !== undefined ? D.classNames[l] : String(l);
    row.append(swatch, document.createTextNode(name)); legend.append(row);
  }
}
window.addEventListener("resize", draw);
draw();
const fromLink = /^#pick=(\\d+)$/.exec(location.hash);  // map.html#pick=42 opens with point 42 picked
if (fromLink && +fromLink[1] < N) pick(+fromLink[1]);
</script></body></html>
"""
