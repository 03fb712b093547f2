"""Pictures of an embedding: a nearest-neighbour grid, and a 2-D map coloured by label with thumbnails.

Both are PNGs drawn with matplotlib's object-oriented ``Figure`` API (no ``pyplot``: no display
needed, a notebook's backend left alone); matplotlib is the ``plot`` extra.

- :func:`neighbour_grid`: one row per query, the query then its k nearest, the cosine similarity
  under each; a neighbour's frame is green when its label is the query's, red when not.
- :func:`map_png`: the 2-D points of :func:`sslkit.embeddings.projection.project_2d`, one colour per
  label, and a few hundred thumbnails spread over the map so that regions can be read.

Images are uint8 ``(N, C, H, W)`` with C = 1 (grey) or 3 (RGB), as sslkit's datasets return them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sslkit.errors import UserError, install_hint

PLOT_INSTALL = f"pictures need matplotlib: {install_hint('plot')}"


def _figure(width: float, height: float) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise UserError(PLOT_INSTALL) from None
    return Figure(figsize=(width, height), layout="constrained")


def _as_hwc(image: np.ndarray) -> tuple[np.ndarray, str | None]:
    """(C, H, W) uint8 -> what ``imshow`` takes, and the colour map (grey for one channel)."""
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[0] not in (1, 3):
        raise ValueError(f"images must be (C, H, W) with 1 or 3 channels, got {image.shape}")
    if image.shape[0] == 1:
        return image[0], "gray"
    return image.transpose(1, 2, 0), None


def neighbour_grid(
    query_images: np.ndarray,
    neighbour_images: np.ndarray,
    similarities: np.ndarray,
    path: str | Path,
    query_labels: np.ndarray | None = None,
    neighbour_labels: np.ndarray | None = None,
    titles: list[str] | None = None,
) -> Path:
    """Write the grid of ``Q`` queries and their ``k`` nearest neighbours to ``path``.

    Shape:
        query_images: (Q, C, H, W) uint8; neighbour_images: (Q, k, C, H, W) uint8;
        similarities: (Q, k); query_labels: (Q,) or None; neighbour_labels: (Q, k) or None.
    """
    queries, k = similarities.shape
    cell = 1.1
    figure = _figure(cell * (k + 1), cell * queries + 0.3)
    axes = figure.subplots(queries, k + 1, squeeze=False)
    for q in range(queries):
        _show(axes[q, 0], query_images[q], titles[q] if titles else "query", "black")
        for j in range(k):
            same = None if query_labels is None else neighbour_labels[q, j] == query_labels[q]
            colour = "grey" if same is None else ("tab:green" if same else "tab:red")
            _show(axes[q, j + 1], neighbour_images[q, j], f"{similarities[q, j]:.3f}", colour)
    path = Path(path)
    figure.savefig(path, dpi=110)
    return path


def _show(axis: Any, image: np.ndarray, caption: str, frame: str) -> None:
    pixels, cmap = _as_hwc(image)
    axis.imshow(pixels, cmap=cmap, vmin=0, vmax=255)
    axis.set_xticks([])
    axis.set_yticks([])
    axis.set_xlabel(caption, fontsize=7, labelpad=1)
    for spine in axis.spines.values():
        spine.set_edgecolor(frame)
        spine.set_linewidth(2.0)


def spread_sample(points: np.ndarray, count: int, seed: int = 0) -> np.ndarray:
    """Indices of at most ``count`` points spread over the map: one per cell of a square grid over
    the points' bounding box, the cells visited in random order, so dense and sparse regions both
    get thumbnails.

    Shape:
        points: (N, 2); returns (n,) int64 with n <= count.
    """
    side = max(1, int(np.sqrt(count)))
    low, high = points.min(0), points.max(0)
    cells = np.floor((points - low) / np.maximum(high - low, 1e-12) * (side - 1e-6)).astype(np.int64)
    cell_id = cells[:, 0] * side + cells[:, 1]
    order = np.random.default_rng(seed).permutation(len(points))
    _, first = np.unique(cell_id[order], return_index=True)  # one random point of each occupied cell
    return np.sort(order[first])[:count]


def map_png(
    points: np.ndarray,
    path: str | Path,
    labels: np.ndarray | None = None,
    images: np.ndarray | None = None,
    class_names: list[str] | None = None,
    thumbnails: int = 225,
    title: str = "",
) -> Path:
    """Scatter the 2-D ``points`` coloured by label, with up to ``thumbnails`` images placed on the map.

    Shape:
        points: (N, 2); labels: (N,) int or None; images: (N, C, H, W) uint8 or None.
    """
    from matplotlib.offsetbox import AnnotationBbox, OffsetImage

    figure = _figure(9.0, 8.0)
    axis = figure.add_subplot()
    size = max(0.5, min(12.0, 20000.0 / max(len(points), 1)))
    if labels is None:
        axis.scatter(points[:, 0], points[:, 1], s=size, c="tab:blue", linewidths=0)
    else:
        from matplotlib import colormaps

        classes = np.unique(labels)
        colours = colormaps["tab10" if len(classes) <= 10 else "tab20"]
        for i, label in enumerate(classes):
            chosen = labels == label
            name = class_names[label] if class_names is not None and label < len(class_names) else str(label)
            axis.scatter(points[chosen, 0], points[chosen, 1], s=size, color=colours(i % colours.N), label=name)
        axis.legend(markerscale=max(1.0, 12.0 / size), fontsize=8, loc="best", framealpha=0.8)
    if images is not None and thumbnails > 0:
        zoom = 24.0 / max(images.shape[-1], images.shape[-2])  # each thumbnail about 24 px across
        for i in spread_sample(points, thumbnails):
            pixels, cmap = _as_hwc(images[i])
            box = OffsetImage(pixels, cmap=cmap, zoom=zoom)
            axis.add_artist(AnnotationBbox(box, points[i], frameon=False, pad=0.0))
    axis.set_xticks([])
    axis.set_yticks([])
    if title:
        axis.set_title(title, fontsize=10)
    path = Path(path)
    figure.savefig(path, dpi=110)
    return path
