"""Nearest neighbours over embeddings (the search itself is tests/test_search.py's): an item left out of its own list,
queries of another set, a float16 folder, faiss' lists and recall, the files, the command, and one line for each
mistake."""

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sslkit.cli import neighbours as cli
from sslkit.embeddings import nearest_neighbours, neighbours, read_embeddings, recall_at_k, write_embeddings
from sslkit.errors import UserError


def brute_force(vectors: np.ndarray, k: int, queries: np.ndarray | None = None):
    """Every similarity at once, sorted stably (equal values by lowest column), the query itself removed."""
    references = F.normalize(torch.from_numpy(vectors).double(), dim=1)
    asked = references if queries is None else F.normalize(torch.from_numpy(queries).double(), dim=1)
    similarity = asked @ references.T
    if queries is None:
        similarity.fill_diagonal_(float("-inf"))
    ranked = similarity.sort(dim=1, descending=True, stable=True)
    return ranked.values[:, :k].float().numpy(), ranked.indices[:, :k].numpy()


def tied_vectors(n: int = 300, dim: int = 8, seed: int = 0) -> np.ndarray:
    """Vectors of four entries +-1 (norm 2): every similarity a multiple of 1/4, exact in float32, so most
    of them tie; row 10 is a copy of row 3, row 20 twice it."""
    rng = np.random.default_rng(seed)
    vectors = np.zeros((n, dim), dtype=np.float32)
    for row in vectors:
        row[rng.permutation(dim)[:4]] = rng.choice([-1.0, 1.0], 4)
    vectors[10] = vectors[3]
    vectors[20] = 2 * vectors[3]
    return vectors


def clustered(n: int, dim: int, clusters: int, seed: int = 0) -> np.ndarray:
    """Gaussian clusters on the sphere: points a noise of norm about 0.7 away from their unit centre."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    points = centres[rng.integers(0, clusters, n)] + 0.7 * rng.standard_normal((n, dim)) / np.sqrt(dim)
    return points.astype(np.float32)


def test_an_item_is_not_its_own_neighbour_but_its_exact_copy_is():
    vectors = tied_vectors()
    _, indices = nearest_neighbours(vectors, k=5)
    assert not (indices == np.arange(len(vectors))[:, None]).any()
    assert indices[3, :2].tolist() == [10, 20] and indices[10, :2].tolist() == [3, 20]  # equal: lower row first


def test_queries_of_another_set_search_all_of_it():
    vectors, queries = tied_vectors(seed=0), tied_vectors(n=50, seed=1)
    queries[0] = vectors[7]
    similarities, indices = nearest_neighbours(vectors, k=300, queries=queries)
    expected_similarities, expected_indices = brute_force(vectors, 300, queries)
    np.testing.assert_array_equal(indices, expected_indices)
    np.testing.assert_allclose(similarities, expected_similarities, atol=1e-6)
    assert indices[0, 0] == 7 and similarities[0, 0] == pytest.approx(1.0)


def test_a_float16_folder_is_read_from_disk_and_searched_as_its_values(tmp_path):
    vectors = clustered(500, 16, 10).astype(np.float16)
    write_embeddings(tmp_path, vectors, [str(i) for i in range(500)])
    on_disk = read_embeddings(tmp_path).vectors
    assert isinstance(on_disk, np.memmap)
    _, indices = nearest_neighbours(on_disk, k=8)
    np.testing.assert_array_equal(indices, brute_force(vectors.astype(np.float32), 8)[1])


@pytest.mark.parametrize("faiss_type", ["ivf", "hnsw"])
def test_faiss_lists_leave_each_item_out_most_similar_first(faiss_type):
    vectors = clustered(2000, 32, 20)
    similarities, indices = nearest_neighbours(vectors, k=10, index="faiss", faiss_type=faiss_type)
    assert indices.shape == (2000, 10) and not (indices == np.arange(len(vectors))[:, None]).any()
    assert (np.diff(similarities, axis=1) <= 1e-6).all()


def test_faiss_queries_of_another_set_and_recall_of_known_lists():
    vectors, queries = clustered(3000, 32, 30, seed=0), clustered(200, 32, 30, seed=0)[:200] + 0.01
    _, indices = nearest_neighbours(vectors, k=10, queries=queries, index="faiss", faiss_type="hnsw")
    exact = brute_force(vectors, 10, queries)[1]
    assert recall_at_k(vectors, exact, queries, sample=200) == 1.0
    assert recall_at_k(vectors, indices, queries, sample=200) > 0.9
    assert recall_at_k(vectors, exact[::-1].copy(), queries, sample=200) < 0.1  # another query's neighbours


def test_mistakes_are_one_line_each(monkeypatch):
    vectors = clustered(20, 8, 2)
    with pytest.raises(UserError, match="k=20 is more neighbours than there are \\(20 items less the query itself"):
        nearest_neighbours(vectors, k=20)
    with pytest.raises(UserError, match="k=21 is more neighbours than there are \\(20 items\\): give k <= 20"):
        nearest_neighbours(vectors, k=21, queries=vectors[:3])
    with pytest.raises(UserError, match="k must be a whole number >= 1, got 0"):
        nearest_neighbours(vectors, k=0)
    with pytest.raises(UserError, match="nprobe must be >= 1, got 0"):
        nearest_neighbours(vectors, k=3, index="faiss", nprobe=0)
    with pytest.raises(UserError, match="the queries have 4 dimensions, the embeddings 8: embed both"):
        nearest_neighbours(vectors, k=3, queries=vectors[:, :4])
    broken = vectors.copy()
    broken[13, 2] = np.nan
    with pytest.raises(UserError, match="row 13 has NaN or inf values"):
        nearest_neighbours(broken, k=3)
    monkeypatch.setitem(sys.modules, "faiss", None)  # as if faiss-cpu were not installed
    with pytest.raises(UserError, match='faiss, which is not installed: pip install "sslkit\\[faiss\\]"'):
        nearest_neighbours(vectors, k=3, index="faiss")


def test_a_failed_write_leaves_nothing(tmp_path):
    out = tmp_path / "neighbours.csv"
    with pytest.raises(IndexError):
        neighbours.save_neighbours(out, np.ones((2, 1), np.float32), np.array([[1], [5]]), ["a", "b"], ["a", "b"])
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- the command


@pytest.fixture
def folder(tmp_path):
    vectors = tied_vectors(n=60)
    return write_embeddings(tmp_path / "emb", vectors, [f"img{i}.png" for i in range(60)])


def test_the_command_writes_the_exact_neighbours_as_npz(folder, capsys):
    assert cli.main([str(folder), "--k", "4"]) == 0
    saved = np.load(folder / "neighbours.npz")
    similarities, indices = nearest_neighbours(tied_vectors(n=60), k=4)
    np.testing.assert_array_equal(saved["indices"], indices)
    np.testing.assert_array_equal(saved["similarities"], similarities)
    assert "4 nearest of 60 items among 60" in capsys.readouterr().out


def test_the_command_writes_csv_with_item_names_and_queries_from_another_folder(folder, tmp_path):
    queries = write_embeddings(tmp_path / "q", tied_vectors(n=60)[[3, 5]], ["q3.png", "q5.png"])
    out = tmp_path / "nn.csv"
    assert cli.main([str(folder), "--queries", str(queries), "--k", "3", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "query_row,query_item,rank,neighbour_row,neighbour_item,similarity"
    assert lines[1] == "0,q3.png,1,3,img3.png,1.000000" and lines[2].startswith("0,q3.png,2,10,img10.png,")
    assert len(lines) == 1 + 2 * 3


def test_the_command_measures_faiss_recall(folder, capsys):
    arguments = ["--k", "5", "--index", "faiss", "--faiss-type", "hnsw", "--recall-sample", "20"]
    assert cli.main([str(folder), *arguments]) == 0
    assert "recall@5 against the exact search on 20 queries: " in capsys.readouterr().out


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--k", "60"], "k=60 is more neighbours than there are (60 items less the query itself"),
        (["--index", "faiss"], 'pip install "sslkit[faiss]"'),
        (["--out", "nn.txt"], "give a file ending in .npz or .csv"),
        (["--recall-sample", "10"], "add --index faiss"),
    ],
)
def test_a_mistake_is_one_line_and_nothing_is_written(folder, monkeypatch, capsys, arguments, message):
    monkeypatch.setitem(sys.modules, "faiss", None)
    before = sorted(folder.iterdir())
    assert cli.main([str(folder), *arguments]) == 2
    error = capsys.readouterr().err
    assert message in " ".join(error.split()) and len(error.strip().splitlines()) == 1
    assert sorted(folder.iterdir()) == before


def test_a_folder_whose_files_disagree_is_one_line(folder, capsys):
    np.save(folder / "embeddings.npy", np.ones((61, 8), np.float32))
    assert cli.main([str(folder)]) == 2
    assert "holds 61 rows but items.csv 60" in capsys.readouterr().err
    assert not (folder / "neighbours.npz").exists()


def test_queries_of_another_dimension_are_one_line(folder, tmp_path, capsys):
    queries = write_embeddings(tmp_path / "q", np.ones((2, 5), np.float32), ["a", "b"])
    assert cli.main([str(folder), "--queries", str(queries)]) == 2
    assert "the queries have 5 dimensions, the embeddings 8" in capsys.readouterr().err


@pytest.mark.slow
def test_the_installed_module_runs_as_a_process(folder):
    result = subprocess.run(
        [sys.executable, "-m", "sslkit.cli.neighbours", str(folder), "--k", "2", "--out", str(folder / "n.csv")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (folder / "n.csv").read_text().count("\n") == 1 + 60 * 2
