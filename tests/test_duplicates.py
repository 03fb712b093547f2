"""Near-duplicates: SemDeDup against a plain loop over every pair written from the algorithm, its k-means, the
near-copies of one set in another, the files, the command, and one line for each mistake."""

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sslkit.cli import duplicates as cli
from sslkit.embeddings import duplicates, near_copies, semdedup, write_embeddings
from sslkit.errors import UserError

THRESHOLD = 0.95


def naive_semdedup(vectors: np.ndarray, clusters: np.ndarray, threshold: float, keep: str):
    """The algorithm as written, one item and one pair at a time in float64: each cluster walked in the keep
    rule's order (similarity to the cluster's normalised mean; equal values by row), an item a duplicate of
    the most similar item kept before it when that similarity is at least the threshold."""
    x = vectors.astype(np.float64) / np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)
    group_of, similarity = np.arange(len(x)), np.ones(len(x))
    for cluster in np.unique(clusters):
        members = np.flatnonzero(clusters == cluster)
        centroid = x[members].sum(axis=0)
        to_centroid = x[members] @ (centroid / np.linalg.norm(centroid))
        key = {"farthest": to_centroid, "nearest": -to_centroid, "first": np.zeros(len(members))}[keep]
        kept = []
        for item in members[np.lexsort((members, key))]:
            similarities = [float(x[other] @ x[item]) for other in kept]
            if similarities and max(similarities) >= threshold:
                best = int(np.argmax(similarities))
                group_of[item], similarity[item] = kept[best], similarities[best]
            else:
                kept.append(item)
    return group_of, similarity


def near_duplicates(n_bases: int = 80, dim: int = 16, seed: int = 0) -> np.ndarray:
    """Random bases, each with 0 to 4 noisy copies at similarities from about 0.9 to 0.999: groups, chains
    (a ~ b ~ c, a !~ c) and pairs on either side of the threshold; shuffled."""
    rng = np.random.default_rng(seed)
    rows = []
    for base in rng.standard_normal((n_bases, dim)):
        base /= np.linalg.norm(base)
        rows.append(base)
        for _ in range(rng.integers(0, 5)):
            rows.append(base + rng.uniform(0.03, 0.45) * rng.standard_normal(dim) / np.sqrt(dim))
    vectors = np.array(rows, dtype=np.float32)
    return vectors[rng.permutation(len(vectors))]


def pairs_near(vectors: np.ndarray, threshold: float, margin: float) -> int:
    x = F.normalize(torch.from_numpy(vectors).double(), dim=1)
    similarity = (x @ x.T).fill_diagonal_(0)
    return int(((similarity - threshold).abs() < margin).sum())


@pytest.mark.parametrize("keep", ["farthest", "nearest", "first"])
@pytest.mark.parametrize("block_rows", [1, 7, 10_000])
def test_semdedup_is_the_plain_loop_over_every_pair(keep, block_rows, monkeypatch):
    monkeypatch.setattr(duplicates, "rows_per_block", lambda n: block_rows)
    vectors = near_duplicates()
    assert pairs_near(vectors, THRESHOLD, 1e-5) == 0  # float32 and float64 decide every pair alike
    clusters = np.random.default_rng(1).integers(0, 3, len(vectors))
    found = semdedup(vectors, THRESHOLD, keep=keep, clusters=clusters)
    group_of, similarity = naive_semdedup(vectors, clusters, THRESHOLD, keep)
    np.testing.assert_array_equal(found.group_of, group_of)
    np.testing.assert_allclose(found.similarity, similarity, atol=1e-5)
    assert found.kept.tolist() == (group_of == np.arange(len(vectors))).tolist()
    assert 20 < found.num_duplicates < len(vectors) // 2  # the data has duplicates, and items that are not


def test_one_cluster_compares_every_pair(monkeypatch):
    monkeypatch.setattr(duplicates, "rows_per_block", lambda n: 5)
    vectors = near_duplicates(seed=2)
    found = semdedup(vectors, np.float32(THRESHOLD), num_clusters=1, keep="first")  # any real number
    group_of, _ = naive_semdedup(vectors, np.zeros(len(vectors), dtype=np.int64), THRESHOLD, "first")
    np.testing.assert_array_equal(found.group_of, group_of)
    assert found.kmeans == "none"


def test_a_chain_keeps_both_ends_and_each_removed_item_has_a_kept_one_to_stand_for_it():
    angle = np.arccos(0.97)  # a ~ b and b ~ c at 0.97, a and c at cos(2 angle) = 0.88
    chain = np.array([[np.cos(t), np.sin(t)] for t in (0, angle, 2 * angle)], dtype=np.float32)
    found = semdedup(chain, THRESHOLD, num_clusters=1, keep="first")
    assert found.kept.tolist() == [True, False, True] and found.group_of.tolist() == [0, 0, 2]
    assert found.similarity[1] == pytest.approx(0.97, abs=1e-6)


def test_the_keep_rule_picks_the_item_farthest_from_or_nearest_to_the_centroid():
    # A group of three near (1, 0) and a far item pulling the centroid away from the group's first member.
    vectors = np.array([[1, 0.0], [1, 0.02], [1, 0.04], [0, 1]], dtype=np.float32)
    for keep, kept in [("farthest", 0), ("nearest", 2), ("first", 0)]:
        found = semdedup(vectors, 0.99, keep=keep, clusters=np.zeros(4, dtype=np.int64))
        assert found.kept.tolist() == [i == kept for i in range(3)] + [True], keep
        assert [rows.tolist() for rows in found.groups()] == [[kept, *sorted({0, 1, 2} - {kept})]]


@pytest.mark.parametrize("backend", ["faiss", "torch"])
def test_semdedup_finds_the_copies_within_the_clusters_of_either_kmeans(backend):
    rng = np.random.default_rng(0)
    centres = F.normalize(torch.randn(6, 32, generator=torch.Generator().manual_seed(0)), dim=1).numpy()
    truth = rng.integers(0, 6, 600)
    vectors = (centres[truth] + 0.3 * rng.standard_normal((600, 32)) / np.sqrt(32)).astype(np.float32)
    vectors[500:520] = vectors[:20] * 3  # exact copies, scaled
    found = semdedup(vectors, 0.999, num_clusters=6, kmeans=backend)
    assert found.kmeans == backend and len(np.unique(found.clusters)) == 6  # k-means itself: tests/test_search.py
    assert found.num_duplicates == 20  # one of each copy and its original: equally far from their centroid
    assert sorted(sorted(rows.tolist()) for rows in found.groups()) == [[i, 500 + i] for i in range(20)]


def test_without_faiss_the_kmeans_is_torchs_and_asking_for_faiss_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)
    vectors = near_duplicates()
    assert semdedup(vectors, THRESHOLD, num_clusters=3).kmeans == "torch"
    with pytest.raises(UserError, match='pip install "sslkit\\[faiss\\]"'):
        semdedup(vectors, THRESHOLD, num_clusters=3, kmeans="faiss")


def test_near_copies_are_each_items_nearest_in_the_other_set():
    train = near_duplicates(seed=3)
    test = np.concatenate([train[[4, 9]] * 2, near_duplicates(n_bases=5, seed=4)])
    copies = near_copies(test, train, THRESHOLD)
    x, y = F.normalize(torch.from_numpy(test), dim=1), F.normalize(torch.from_numpy(train), dim=1)
    best = (x @ y.T).max(dim=1)
    assert copies.nearest.tolist() == best.indices.tolist()
    np.testing.assert_allclose(copies.similarity, best.values.numpy(), atol=1e-6)
    assert copies.is_copy.tolist() == (best.values.numpy() >= THRESHOLD).tolist()
    assert copies.is_copy[:2].all() and copies.nearest[:2].tolist() == [4, 9]


@pytest.mark.parametrize("threshold", [0, -0.5, 1.5, True])
def test_a_threshold_outside_zero_to_one_is_one_line(threshold):
    with pytest.raises(UserError, match="the threshold must be a cosine similarity in \\(0, 1\\]"):
        semdedup(near_duplicates(), threshold)
    with pytest.raises(UserError, match="the threshold must be a cosine similarity in \\(0, 1\\]"):
        near_copies(near_duplicates(), near_duplicates(), threshold)


def test_more_clusters_than_items_and_an_unknown_keep_rule_are_one_line():
    with pytest.raises(UserError, match="the number of clusters must be between 1 and the 3 items, got 4"):
        semdedup(np.eye(3, dtype=np.float32), THRESHOLD, num_clusters=4)
    with pytest.raises(UserError, match="keep must be one of farthest, nearest, first"):
        semdedup(np.eye(3, dtype=np.float32), THRESHOLD, keep="random")


def test_each_items_nearest_similarity_in_its_cluster_is_the_plain_loops():
    vectors = near_duplicates()
    found = semdedup(vectors, THRESHOLD, num_clusters=3, kmeans="torch")
    x = vectors.astype(np.float64) / np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)
    for item in range(len(x)):
        others = [o for o in np.flatnonzero(found.clusters == found.clusters[item]) if o != item]
        expected = max((float(x[o] @ x[item]) for o in others), default=-1.0)
        assert found.nearest[item] == pytest.approx(expected, abs=1e-5)
    assert found.threshold == THRESHOLD
    for value, count in duplicates.threshold_table(found):  # a bound on what each threshold removes
        assert semdedup(vectors, value, clusters=found.clusters).num_duplicates <= count


@pytest.mark.parametrize("fraction", [0.05, 0.2, 0.5])
def test_a_fraction_finds_the_highest_threshold_that_removes_that_many(fraction):
    vectors = near_duplicates()
    target = round(fraction * len(vectors))
    found = semdedup(vectors, fraction=fraction, num_clusters=1)
    assert found.num_duplicates >= target
    assert semdedup(vectors, found.threshold, num_clusters=1).kept.tolist() == found.kept.tolist()
    assert semdedup(vectors, found.threshold + 1e-6, num_clusters=1).num_duplicates < target


def test_a_fraction_no_threshold_reaches_and_two_ways_to_say_it_are_one_line():
    with pytest.raises(UserError, match="no threshold in \\(0, 1\\] removes"):
        semdedup(np.eye(4, dtype=np.float32), fraction=0.5, num_clusters=1)  # every pair at similarity 0
    with pytest.raises(UserError, match="one of the two"):
        semdedup(near_duplicates(), 0.9, fraction=0.1)
    with pytest.raises(UserError, match="must be in \\(0, 1\\), e.g. 0.05"):
        semdedup(near_duplicates(), fraction=1.0)


# --------------------------------------------------------------------------- the command


@pytest.fixture
def folder(tmp_path):
    vectors = near_duplicates()
    return write_embeddings(tmp_path / "emb", vectors, [f"img{i}.png" for i in range(len(vectors))])


def test_the_command_writes_the_groups(folder, capsys):
    assert cli.main([str(folder), "--threshold", str(THRESHOLD), "--clusters", "1", "--keep", "first"]) == 0
    found = semdedup(near_duplicates(), THRESHOLD, num_clusters=1, keep="first")
    lines = (folder / "duplicates.csv").read_text().splitlines()
    assert lines[0] == "group,row,item,kept,similarity"
    listed = [line.split(",") for line in lines[1:]]
    groups = found.groups()
    assert len(listed) == sum(len(rows) for rows in groups)
    assert [int(cells[1]) for cells in listed] == [int(row) for rows in groups for row in rows]
    assert all(cells[3] == str(bool(found.kept[int(cells[1])])) for cells in listed)
    assert listed[0][2] == f"img{groups[0][0]}.png" and listed[0][4] == "1.000000"
    assert f"{found.num_duplicates} of {len(found.kept)} items" in capsys.readouterr().out


def test_the_command_finds_the_threshold_for_a_fraction_and_shows_what_each_threshold_could_remove(folder, capsys):
    assert cli.main([str(folder), "--fraction", "0.1", "--clusters", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    found = semdedup(near_duplicates(), fraction=0.1, num_clusters=1)
    assert f"{found.num_duplicates} of {len(found.kept)} items" in out
    assert f"the threshold that removes 10.00% of the items: {found.threshold:.4f}" in out
    for value, count in duplicates.threshold_table(found):
        assert f"{value:g} │ {count:,} │" in out


def test_the_command_finds_near_copies_against_another_folder(folder, tmp_path, capsys):
    train = near_duplicates()
    test = write_embeddings(tmp_path / "test", np.concatenate([train[[4]], -train[[4]]]), ["copy.png", "far.png"])
    out = tmp_path / "copies.csv"
    assert cli.main([str(test), "--threshold", "0.99", "--against", str(folder), "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "row,item,nearest_row,nearest_item,similarity,near_copy"
    assert lines[1] == "0,copy.png,4,img4.png,1.000000,True" and lines[2].endswith(",False")
    assert "1 of 2 items (50.00%) have a near-copy" in capsys.readouterr().out


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--threshold", "1.5"], "the threshold must be a cosine similarity in (0, 1], e.g. 0.95"),
        (["--fraction", "1.5"], "the fraction to remove must be in (0, 1), e.g. 0.05"),
        (["--fraction", "0.1", "--against", "."], "--fraction is for duplicates within a folder"),
        (["--threshold", "0.9", "--clusters", "100000"], "the number of clusters must be between 1 and the"),
        (["--threshold", "0.9", "--out", "d.txt"], "give a file ending in .csv"),
        (["--threshold", "0.9", "--kmeans", "faiss", "--clusters", "2"], 'pip install "sslkit[faiss]"'),
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
    np.save(folder / "embeddings.npy", np.ones((3, 16), np.float32))
    assert cli.main([str(folder), "--threshold", "0.9"]) == 2
    assert "holds 3 rows but items.csv" in capsys.readouterr().err


@pytest.mark.slow
def test_the_installed_module_runs_as_a_process(folder):
    command = [sys.executable, "-m", "sslkit.cli.duplicates", str(folder), "--threshold", "0.95", "--clusters", "2"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (folder / "duplicates.csv").read_text().startswith("group,row,item,kept,similarity\n")
