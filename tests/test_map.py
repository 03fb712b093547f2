"""sslkit-map: the map and neighbour pictures of an embeddings folder, with thumbnails read back from its images."""

from pathlib import Path

import numpy as np
import pytest

from sslkit.cli.map import main
from sslkit.embeddings import read_embeddings, write_embeddings
from sslkit.embeddings.images import images_to_embed
from sslkit.embeddings.maps import images_of, thumbnails
from sslkit.errors import UserError
from sslkit.schema import Config

FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory):
    """The digits test split's raw pixels as an embeddings folder that names its images as sslkit-embed does."""
    images = images_to_embed(Config(), "digits", "test")
    pixels, _ = images.dataset.__getitems__(list(range(len(images))))
    vectors = pixels.reshape(len(images), -1).float().numpy()
    meta = {"data": {"name": "digits", "split": "test", "root": None, "labelled": True}}
    return write_embeddings(tmp_path_factory.mktemp("digits"), vectors, images.items, images.labels, meta)


def test_thumbnails_are_the_rows_images(digits_folder):
    embeddings = read_embeddings(digits_folder)
    images = images_of(embeddings)
    small = thumbnails(images, np.array([3, 0]), size=16)
    assert small.shape == (2, 1, 16, 16) and small.dtype == np.uint8
    whole, _ = images.dataset.__getitems__([3])
    assert abs(small[0].astype(float).mean() - whole.float().mean().item()) < 8  # the same image, resized


def test_the_command_writes_the_map_page_and_the_neighbour_grid(digits_folder, tmp_path, capsys):
    assert main([str(digits_folder), "--out", str(tmp_path), "--sample", "200", "--k", "5"]) == 0
    assert "200 of 360 rows" in capsys.readouterr().out
    for name in ("map.png", "map.html", "neighbours.png"):
        assert (tmp_path / name).stat().st_size > 10_000, name
    page = (tmp_path / "map.html").read_text()
    assert page.count("data:image/png;base64,") == 1 and '"neighbours":[[' in page


def test_the_map_names_the_classes_the_folder_names(tmp_path):
    images = images_to_embed(Config(), "fashion_mnist", "test") if FASHION.is_dir() else None
    if images is None:
        pytest.skip("Fashion-MNIST's files are not installed")
    vectors = np.random.default_rng(0).normal(size=(60, 4)).astype(np.float32)
    folder = write_embeddings(
        tmp_path / "e", vectors, images.items[:60], images.labels[:60], {"data": images.describe()}
    )
    assert main([str(folder), "--out", str(tmp_path), "--no-thumbnails", "--k", "3"]) == 0
    assert '"classNames":["T-shirt/top","Trouser",' in (tmp_path / "map.html").read_text()


def test_points_only_without_thumbnails(digits_folder, tmp_path):
    assert main([str(digits_folder), "--out", str(tmp_path), "--no-thumbnails", "--sample", "100"]) == 0
    assert (tmp_path / "map.html").is_file() and not (tmp_path / "neighbours.png").exists()


def test_mistakes_are_one_line(digits_folder, tmp_path, capsys):
    assert main([str(digits_folder), "--out", str(tmp_path), "--k", "400"]) == 2
    assert "--k 400: give 1 to 359" in capsys.readouterr().err
    changed = write_embeddings(tmp_path / "changed", np.eye(3, dtype=np.float32), ["a", "b", "c"], None,
                               {"data": {"name": "digits", "split": "test", "root": None}})  # fmt: skip
    with pytest.raises(UserError, match="changed since it was written"):
        images_of(read_embeddings(changed))


def test_a_runs_report_shows_the_pictures_of_its_embeddings(digits_folder, tmp_path):
    import shutil

    from sslkit.experiments.report import write_report
    from sslkit.schema import save_config

    save_config(Config(), tmp_path / "config.yaml")
    shutil.copytree(digits_folder, tmp_path / "embeddings-digits-test")
    report = write_report(tmp_path).read_text()
    assert "## Embeddings" in report and "360 rows of 64 dimensions" in report
    assert "(embeddings-digits-test/map.html)" in report and "![map of embeddings-digits-test]" in report
    assert (tmp_path / "embeddings-digits-test" / "map.png").is_file()  # drawn by the report, where missing
