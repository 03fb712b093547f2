"""The pictures of an embeddings folder: a map of the set (PNG and HTML) and a grid of nearest neighbours.

:func:`draw_pictures` is ``sslkit-map``: it projects the rows to 2-D (:mod:`.projection`), finds each
row's nearest neighbours by cosine (:func:`sslkit.embeddings.nearest_neighbours`), reads back the
images the folder's ``meta.json`` names (:func:`images_of`) for thumbnails, and writes

- ``map.png``: the points coloured by label, with thumbnails spread over the map (:mod:`.pictures`);
- ``map.html``: the same map as one offline page, hover for an image, click for its neighbours
  (:mod:`.html_map`);
- ``neighbours.png``: a few random rows with their nearest neighbours and similarities.

A folder of more than ``sample`` rows is drawn from a seeded random sample of them: t-SNE on
60,000 points takes tens of minutes on a CPU, and a page of 60,000 thumbnails weighs 50 MB.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from sslkit.datasets import DATASETS
from sslkit.datasets.batches import ImageBatch
from sslkit.embeddings.html_map import write_html_map
from sslkit.embeddings.images import Images, images_to_embed
from sslkit.embeddings.neighbours import nearest_neighbours
from sslkit.embeddings.pictures import map_png, neighbour_grid
from sslkit.embeddings.projection import project_2d
from sslkit.embeddings.store import Embeddings
from sslkit.errors import UserError
from sslkit.schema import Config

THUMBNAIL = 32  # pixels a side


@dataclass(frozen=True)
class Pictures:
    """What :func:`draw_pictures` wrote, and of how many rows."""

    map_png: Path
    map_html: Path
    neighbours_png: Path
    rows: int
    of: int


def images_of(embeddings: Embeddings) -> Images:
    """The images the rows of ``embeddings`` were made from, as ``meta.json`` names them, in the same order.

    Raises:
        UserError: the images are gone or changed since (another count or other names).
    """
    data = embeddings.meta.get("data")
    if not isinstance(data, dict):
        raise UserError(f"'{embeddings.folder}' does not say which images it holds (no 'data' in meta.json)")
    named = data["name"] in DATASETS
    # Thumbnails need the images as stored, not the run's training resolution: the defaults do.
    images = images_to_embed(
        Config(), data["name"] if named else data["root"], data["split"], data["root"] if named else None
    )
    if images.items != embeddings.items:
        raise UserError(
            f"the images of '{embeddings.folder}' changed since it was written ({len(images.items)} now, "
            f"{len(embeddings.items)} then, or other names); embed them again, or pass --no-thumbnails"
        )
    return images


def thumbnails(images: Images, rows: np.ndarray, size: int = THUMBNAIL) -> np.ndarray:
    """Rows of ``images`` resized to ``size`` a side (each image whole, squashed to a square).

    Shape:
        rows: (n,); returns (n, C, size, size) uint8.
    """
    out = []
    for start in range(0, len(rows), 256):
        batch, _ = images.dataset.__getitems__(rows[start : start + 256].tolist())
        if isinstance(batch, ImageBatch):  # images of different sizes, each in the corner of a padded slot
            pieces = [batch.pixels[i, :, :h, :w] for i, (h, w) in enumerate(batch.sizes.tolist())]
        else:
            pieces = list(batch)
        for image in pieces:
            small = F.interpolate(image[None].float(), size=(size, size), mode="bilinear", antialias=True)
            out.append(small[0].round().clamp(0, 255).to(torch.uint8))
    return torch.stack(out).numpy()


def draw_pictures(
    embeddings: Embeddings,
    out: str | Path,
    method: str = "pca",
    k: int = 8,
    sample: int = 5000,
    queries: int = 8,
    with_images: bool = True,
    seed: int = 0,
) -> Pictures:
    """Write ``map.png``, ``map.html`` and ``neighbours.png`` of ``embeddings`` into the folder ``out``."""
    count = len(embeddings)
    if k < 1 or k >= min(count, sample):
        raise UserError(f"--k {k}: give 1 to {min(count, sample) - 1} (the map holds {min(count, sample)} rows)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    generator = np.random.default_rng(seed)
    rows = np.sort(generator.choice(count, sample, replace=False)) if count > sample else np.arange(count)
    vectors = np.asarray(embeddings.vectors[rows], dtype=np.float32)  # (n, D), read from the memmap
    labels = None if embeddings.labels is None else embeddings.labels[rows]
    names = [embeddings.items[i] for i in rows]
    points = project_2d(vectors, method, seed)
    similarities, neighbours = nearest_neighbours(vectors, k)  # (n, k) each, itself left out
    pixels = thumbnails(images_of(embeddings), rows) if with_images else None
    title = f"{embeddings.folder.name}: {len(rows)} of {count} rows, {method}"
    classes = embeddings.meta.get("data", {}).get("classes")  # names of the labels, where sslkit-embed knew them
    written_map = map_png(points, out / "map.png", labels, pixels, title=title, class_names=classes)
    page = write_html_map(
        out / "map.html", points, names, labels, pixels, neighbours, similarities, title=title, class_names=classes
    )
    grid = _neighbour_grid(out / "neighbours.png", generator, pixels, similarities, neighbours, labels, names, queries)
    return Pictures(written_map, page, grid, len(rows), count)


def _neighbour_grid(path, generator, pixels, similarities, neighbours, labels, names, queries: int) -> Path | None:
    """``queries`` random rows with their neighbours; None without images to show."""
    if pixels is None:
        return None
    chosen = np.sort(generator.choice(len(neighbours), min(queries, len(neighbours)), replace=False))
    near = neighbours[chosen]  # (q, k)
    return neighbour_grid(
        pixels[chosen], pixels[near], similarities[chosen], path,
        None if labels is None else labels[chosen], None if labels is None else labels[near],
        titles=[names[i][-18:] for i in chosen],
    )  # fmt: skip
