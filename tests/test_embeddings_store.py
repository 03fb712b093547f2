"""The embeddings folder: written, read back, and refused in one line when its files disagree."""

import json

import numpy as np
import pytest

from sslkit.embeddings import read_embeddings, write_embeddings
from sslkit.errors import UserError


def test_a_folder_reads_back_what_was_written(tmp_path):
    vectors = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float16)
    write_embeddings(tmp_path, vectors, [f"img{i}.png" for i in range(5)], np.array([0, 1, 1, 2, 0]), {"layer": "x"})
    read = read_embeddings(tmp_path)
    np.testing.assert_array_equal(read.vectors, vectors)
    assert read.items[3] == "img3.png" and read.labels.tolist() == [0, 1, 1, 2, 0]
    assert read.meta["layer"] == "x" and read.meta["dimension"] == 4 and not read.normalized


def test_unlabelled_items_have_no_labels_and_unit_rows_are_normalized(tmp_path):
    write_embeddings(tmp_path, np.eye(3, dtype=np.float32), ["0", "1", "2"])
    read = read_embeddings(tmp_path)
    assert read.labels is None and read.normalized


def test_items_and_vectors_of_different_lengths_are_one_line(tmp_path):
    write_embeddings(tmp_path, np.eye(3, dtype=np.float32), ["0", "1", "2"])
    np.save(tmp_path / "embeddings.npy", np.eye(4, dtype=np.float32))
    with pytest.raises(UserError, match="4 rows but items.csv 3"):
        read_embeddings(tmp_path)


def test_an_unfinished_folder_is_refused(tmp_path):
    write_embeddings(tmp_path, np.eye(3, dtype=np.float32), ["0", "1", "2"])
    meta = json.loads((tmp_path / "meta.json").read_text())
    (tmp_path / "meta.json").write_text(json.dumps({**meta, "complete": False, "rows_done": 1}))
    with pytest.raises(UserError, match="unfinished sslkit-embed run \\(1 of 3"):
        read_embeddings(tmp_path)


def test_not_a_folder_and_missing_files_are_one_line(tmp_path):
    with pytest.raises(UserError, match="not a folder"):
        read_embeddings(tmp_path / "nowhere")
    with pytest.raises(UserError, match="no embeddings.npy, items.csv, meta.json"):
        read_embeddings(tmp_path)
