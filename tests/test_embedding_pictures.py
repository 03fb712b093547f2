"""Pictures of an embedding: 2-D projections, the neighbour grid and map PNGs, and the HTML map in a real browser."""

import importlib.util
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits

from sslkit.embeddings.html_map import write_html_map
from sslkit.embeddings.pictures import map_png, neighbour_grid, spread_sample
from sslkit.embeddings.projection import project_2d
from sslkit.errors import UserError

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=5000",
]


@pytest.fixture(scope="module")
def digits():
    """400 digits: images (N, 1, 8, 8) uint8, their pixels as vectors, labels, and each one's 5 nearest."""
    data = load_digits()
    images = (data.images[:400] * 16).clip(0, 255).astype(np.uint8)[:, None]
    vectors = data.data[:400].astype(np.float32)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    nearest = np.argsort(-similarity, axis=1)[:, :5]
    return images, vectors, data.target[:400], nearest, np.take_along_axis(similarity, nearest, 1)


def _coloured_pixels(path) -> int:
    """Pixels that are neither white, grey nor black: the coloured marks of a plot or a page."""
    rgb = np.asarray(Image.open(path).convert("RGB")).astype(int)
    spread = rgb.max(axis=2) - rgb.min(axis=2)
    return int((spread > 60).sum())


def test_pca_separates_the_digit_classes_and_is_deterministic(digits):
    _, vectors, labels, _, _ = digits
    points = project_2d(vectors, "pca")
    assert points.shape == (400, 2) and points.dtype == np.float32
    np.testing.assert_array_equal(points, project_2d(vectors, "pca"))
    # zeros and ones sit apart in pixel space: their centroids are further apart than a zero's spread
    zeros, ones = points[labels == 0], points[labels == 1]
    assert np.linalg.norm(zeros.mean(0) - ones.mean(0)) > np.linalg.norm(zeros - zeros.mean(0), axis=1).mean()


def test_tsne_keeps_neighbours_together(digits):
    _, vectors, labels, _, _ = digits
    points = project_2d(vectors[:150], "tsne")
    distance = np.linalg.norm(points[:, None] - points[None], axis=2)
    np.fill_diagonal(distance, np.inf)
    same = labels[:150][distance.argmin(1)] == labels[:150]
    assert same.mean() > 0.85  # the nearest point on the map is mostly of the same digit


@pytest.mark.slow  # numba compiles UMAP's kernels on first use: about 15 s
@pytest.mark.skipif(importlib.util.find_spec("umap") is None, reason="umap-learn is not installed")
def test_umap_keeps_neighbours_together(digits):
    _, vectors, labels, _, _ = digits
    points = project_2d(vectors[:150], "umap")
    distance = np.linalg.norm(points[:, None] - points[None], axis=2)
    np.fill_diagonal(distance, np.inf)
    assert (labels[:150][distance.argmin(1)] == labels[:150]).mean() > 0.85


def test_umap_without_umap_learn_says_how_to_install_it(digits, monkeypatch):
    _, vectors, _, _, _ = digits
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "umap" else real(name, *a))
    with pytest.raises(UserError, match='pip install "sslkit\\[umap\\]"'):
        project_2d(vectors, "umap")


def test_unknown_method_and_too_few_points_are_one_line(digits):
    _, vectors, _, _, _ = digits
    with pytest.raises(UserError, match="choose one of: pca, tsne, umap"):
        project_2d(vectors, "isomap")
    with pytest.raises(UserError, match="at least 3"):
        project_2d(vectors[:2])


def test_spread_sample_covers_the_map_without_repeats():
    rng = np.random.default_rng(0)
    dense = rng.normal(0, 0.01, (5000, 2))
    sparse = rng.uniform(-1, 1, (50, 2))
    points = np.concatenate([dense, sparse])
    chosen = spread_sample(points, 100)
    assert len(chosen) <= 100 and len(set(chosen.tolist())) == len(chosen)
    assert (chosen >= 5000).sum() > 10  # the sparse outskirts get thumbnails too, not only the dense centre


def test_neighbour_grid_and_map_are_drawn(digits, tmp_path):
    images, vectors, labels, nearest, similarity = digits
    queries = np.arange(0, 40, 10)
    grid = neighbour_grid(
        images[queries], images[nearest[queries]], similarity[queries], tmp_path / "grid.png",
        labels[queries], labels[nearest[queries]],
    )  # fmt: skip
    assert Image.open(grid).size[0] > Image.open(grid).size[1]  # 6 columns, 4 rows
    assert _coloured_pixels(grid) > 200  # the green and red frames
    drawn = map_png(project_2d(vectors, "pca"), tmp_path / "map.png", labels, images, thumbnails=50)
    assert _coloured_pixels(drawn) > 2000


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium to open the page in")
def test_the_html_map_draws_every_point_and_a_link_picks_one_with_its_neighbours(digits, tmp_path):
    images, vectors, labels, nearest, similarity = digits
    names = [f"digit-{i}.png" for i in range(len(labels))]
    points = project_2d(vectors, "pca")
    page = write_html_map(tmp_path / "map.html", points, names, labels, images, nearest, similarity)
    assert "http" not in page.read_text().split("<script>")[0].replace("http-equiv", "")  # nothing fetched
    profile = ["--user-data-dir=" + str(tmp_path / "profile")]
    dom = subprocess.run(
        [CHROMIUM, *BROWSER_FLAGS, *profile, "--dump-dom", page.as_uri() + "#pick=7"],
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    assert 'data-drawn="400"' in dom
    assert dom.count('class="row neighbour"') == 5 and "digit-7.png" in dom
    assert names[nearest[7, 0]] in dom
    shot = tmp_path / "shot.png"
    subprocess.run(
        [CHROMIUM, *BROWSER_FLAGS, *profile, "--window-size=900,600", f"--screenshot={shot}", page.as_uri()],
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert _coloured_pixels(shot) > 3000  # the points, in their label colours
