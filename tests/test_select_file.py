"""sslkit-select end to end: an embeddings folder in, a label file out; active-learning rounds; bad requests
that write nothing; and ``data.label_subset``, which trains a run on exactly the images the file names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from command_utils import run_main

from sslkit.cli import evaluate as evaluate_cli
from sslkit.cli import label_selection as select_cli
from sslkit.cli import pretrain as pretrain_cli
from sslkit.config import load_config
from sslkit.datasets import build_dataset, build_splits
from sslkit.embeddings import write_embeddings
from sslkit.errors import UserError


def pixel_embeddings(folder: Path, split: str = "train", name: str = "digits") -> Path:
    """An embeddings folder of the digits' raw pixels, items the dataset indices, as sslkit-embed names them."""
    dataset = build_dataset("digits", split, None, False, None)
    vectors = dataset.images.reshape(len(dataset), -1).float().numpy()
    items = [str(i) for i in range(len(dataset))]
    return write_embeddings(folder, vectors, items, dataset.labels.numpy(), {"data": {"name": name, "split": split}})


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    return pixel_embeddings(tmp_path_factory.mktemp("embeddings") / "digits-train")


def select(*argv) -> tuple[int, str, str]:
    done = run_main(select_cli.main, [str(a) for a in argv])
    return done.returncode, done.stdout, done.stderr


def test_the_label_file_names_the_chosen_images_by_dataset_index(digits, tmp_path):
    out = tmp_path / "labels.json"
    status, stdout, _ = select(digits, "--budget", 30, "--strategy", "typiclust", "--out", out)
    assert status == 0
    record = json.loads(out.read_text())
    labels = build_dataset("digits", "train", None, False, None).labels
    assert len(record["chosen"]) == 30 and record["indices"] == sorted(record["chosen"])
    assert record["labels"] == labels[record["indices"]].tolist()  # the classes, for the run to check
    assert record["strategy"] == "typiclust" and record["budget"] == 30 and record["labelled"] is None
    assert record["embeddings"]["count"] == 1437 and record["embeddings"]["data"]["name"] == "digits"
    assert (record["fraction"], record["per_class"], record["seed"]) == (None, None, 0)  # a label_subset.json
    assert f"chose 30 of 1437 images by typiclust: 30 labels in {out}" in stdout
    assert f"data.label_subset={out}" in stdout


def test_an_active_learning_round_adds_the_budget_to_the_labelled_images(digits, tmp_path):
    first, second = tmp_path / "round1.json", tmp_path / "round2.json"
    assert select(digits, "--budget", 20, "--strategy", "kcenter", "--out", first)[0] == 0
    status, stdout, _ = select(digits, "--budget", 15, "--strategy", "kcenter", "--labelled", first, "--out", second)
    assert status == 0 and "added to 20 labelled: 35 labels" in stdout
    one, two = json.loads(first.read_text()), json.loads(second.read_text())
    assert set(one["indices"]) <= set(two["indices"]) and len(two["indices"]) == 35
    assert not set(two["chosen"]) & set(one["indices"]) and two["labelled"]["count"] == 20
    # A text file of items, one a line, is a labelled set too.
    items = tmp_path / "items.txt"
    items.write_text("\n".join(str(i) for i in one["indices"]) + "\n")
    out = tmp_path / "t.json"
    assert select(digits, "--budget", 15, "--strategy", "kcenter", "--labelled", items, "--out", out)[0] == 0
    assert json.loads((tmp_path / "t.json").read_text())["indices"] == two["indices"]


def test_probcover_reports_delta_and_coverage_and_takes_the_classes_from_the_labels(digits, tmp_path):
    status, stdout, _ = select(digits, "--budget", 10, "--strategy", "probcover", "--out", tmp_path / "p.json")
    details = json.loads((tmp_path / "p.json").read_text())["details"]
    assert status == 0 and details["classes"] == 10 and details["purity"] >= 0.95
    assert f"delta {details['delta']:g} (purity" in stdout and "over 10 k-means pseudo-classes" in stdout


def test_the_default_label_file_goes_into_the_embeddings_folder(tmp_path):
    folder = pixel_embeddings(tmp_path / "emb")
    assert select(folder, "--budget", 5, "--strategy", "random", "--seed", 3)[0] == 0
    assert (folder / "labels-random-5-seed3.json").is_file()


def test_image_paths_are_named_as_items(tmp_path):
    vectors = np.random.default_rng(0).normal(size=(40, 4)).astype(np.float32)
    folder = write_embeddings(tmp_path / "emb", vectors, [f"img/{i}.png" for i in range(40)])
    status, stdout, _ = select(folder, "--budget", 4, "--strategy", "kmeans", "--out", tmp_path / "l.json")
    record = json.loads((tmp_path / "l.json").read_text())
    assert status == 0 and "indices" not in record and "labels" not in record
    assert len(record["items"]) == 4 and all(item.startswith("img/") for item in record["items"])
    assert "not by dataset index" in stdout


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--budget", 0, "--strategy", "kmeans"], "a budget of 0 labels: give 1 to 1437"),
        (["--budget", 1438, "--strategy", "kmeans"], "a budget of 1438 labels: give 1 to 1437"),
        (["--budget", 5, "--strategy", "badge"], "choose one of random, kmeans, typiclust, probcover, kcenter"),
        (["--budget", 5, "--strategy", "kmeans", "--labelled", "{unknown}"], "not items of"),
        (["--budget", 5, "--strategy", "kmeans", "--labelled", "{missing}"], "does not exist"),
        (["--budget", 5, "--strategy", "probcover", "--delta", "0"], "--delta must be > 0"),
    ],
)
def test_a_bad_request_is_one_line_and_writes_nothing(digits, tmp_path, argv, words):
    unknown = tmp_path / "unknown.txt"
    unknown.write_text("3\n5000\n")
    argv = [str(a).format(unknown=unknown, missing=tmp_path / "none.json") for a in argv]
    before = sorted(p.name for p in digits.iterdir())
    status, stdout, stderr = select(digits, *argv, "--out", tmp_path / "out.json")
    assert status == 2 and words in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not (tmp_path / "out.json").exists() and sorted(p.name for p in digits.iterdir()) == before


def test_a_budget_past_the_unlabelled_images_counts_the_labelled_ones(digits, tmp_path):
    labelled = tmp_path / "l.txt"
    labelled.write_text("\n".join(map(str, range(100))))
    _, _, stderr = select(digits, "--budget", 1338, "--strategy", "random", "--labelled", labelled)
    assert "give 1 to 1337, the images not labelled yet (1437 in the embeddings, 100 labelled)" in stderr


# --------------------------------------------------------------------------- data.label_subset


@pytest.fixture(scope="module")
def chosen(digits, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("labels") / "labels.json"
    assert select(digits, "--budget", 25, "--strategy", "typiclust", "--out", out)[0] == 0
    return out


def test_a_label_file_is_the_labelled_subset_of_every_role(chosen):
    indices = torch.tensor(json.loads(chosen.read_text())["indices"])
    cfg = load_config("quickstart", [f"data.label_subset={chosen}"])
    splits = build_splits(cfg)
    assert torch.equal(splits.subset, indices) and len(splits.memory) == 25
    assert torch.equal((splits.train.labels >= 0).nonzero().flatten(), indices)  # only those labels are seen
    finetune = load_config("quickstart_finetune", ["data.label_fraction=null", f"data.label_subset={chosen}"])
    supervised = build_splits(finetune, labelled_training=True)
    assert len(supervised.train) == 25 and torch.equal(supervised.subset, indices)
    # The evaluation keys still choose another subset for evaluation alone.
    other = load_config("quickstart", [f"data.label_subset={chosen}", "eval.labels_per_class=2"])
    evaluation = build_splits(other, for_evaluation=True)
    assert len(evaluation.memory) == 20


def test_a_label_file_with_a_fraction_is_one_line():
    with pytest.raises(UserError) as error:  # both on the command line; one there replaces the recipe's 5%
        load_config("quickstart_finetune", ["data.label_subset=labels.json", "data.label_fraction=0.1"])
    message = str(error.value)
    assert "drop data.label_fraction (data.label_fraction=null)" in message and "\n" not in message
    assert load_config("quickstart_finetune", ["data.label_subset=labels.json"]).data.label_fraction is None


def rewritten(chosen: Path, tmp_path: Path, **changes) -> Path:
    record = json.loads(chosen.read_text())
    for key, value in changes.items():
        if "__" in key:
            outer, inner = key.split("__")
            record[outer][inner] = value
        else:
            record[key] = value
    path = tmp_path / "changed.json"
    path.write_text(json.dumps(record))
    return path


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"embeddings__count": 360}, "was chosen among 360 images (digits train) but this run's labelled training "),
        ({"embeddings__data": {"name": "fashion_mnist", "split": "train"}}, "chosen among fashion_mnist train, not"),
        ({"embeddings__data": {"name": "digits", "split": "test"}}, "chosen among digits test, not digits train"),
        ({"labels": "shifted"}, "the classes it records disagree"),
        ({"indices": [0, 5000]}, "names image 5000, but digits's train split has 1437"),
        ({"indices": []}, "holds no 'indices'"),
    ],
)
def test_a_label_file_of_another_dataset_or_split_is_refused_in_one_line(chosen, tmp_path, changes, words):
    if changes.get("labels") == "shifted":
        changes["labels"] = [(c + 1) % 10 for c in json.loads(chosen.read_text())["labels"]]
    path = rewritten(chosen, tmp_path, **changes)
    with pytest.raises(UserError) as error:
        build_splits(load_config("quickstart", [f"data.label_subset={path}"]))
    assert words in str(error.value) and "\n" not in str(error.value)


def test_embeddings_of_the_test_split_are_refused_by_their_count(tmp_path):
    folder = pixel_embeddings(tmp_path / "test", split="test")
    assert select(folder, "--budget", 10, "--strategy", "kmeans", "--out", tmp_path / "t.json")[0] == 0
    with pytest.raises(UserError, match=r"chosen among 360 images \(digits test\) .* has 1437"):
        build_splits(load_config("quickstart", [f"data.label_subset={tmp_path / 't.json'}"]))


def test_a_missing_label_file_or_one_of_paths_is_refused(tmp_path):
    with pytest.raises(UserError, match="does not exist; give the label file sslkit-select wrote"):
        build_splits(load_config("quickstart", [f"data.label_subset={tmp_path / 'none.json'}"]))
    (tmp_path / "paths.json").write_text(json.dumps({"items": ["a.png"]}))
    with pytest.raises(UserError, match="names images by path"):
        build_splits(load_config("quickstart", [f"data.label_subset={tmp_path / 'paths.json'}"]))


def test_labels_of_held_out_classes_are_refused(chosen):
    with pytest.raises(UserError, match="classes data.holdout_classes keeps out"):
        build_splits(load_config("quickstart", [f"data.label_subset={chosen}", "data.holdout_classes=[0]"]))


@pytest.mark.slow
def test_a_run_trains_and_is_evaluated_on_exactly_the_chosen_images(chosen, tmp_path):
    """``sslkit-pretrain RECIPE data.label_subset=FILE``: the run saves and evaluates the file's images."""
    indices = json.loads(chosen.read_text())["indices"]
    argv = [
        "quickstart_finetune",
        "data.label_fraction=null",
        f"data.label_subset={chosen}",
        "train.max_steps=2",
        "train.batch_size=8",
        "eval.linear_epochs=0",
        f"run.output_dir={tmp_path}",
    ]
    done = run_main(pretrain_cli.main, argv)
    assert done.returncode == 0, done.stderr
    run = tmp_path / "quickstart-finetune"
    saved = json.loads((run / "label_subset.json").read_text())
    assert saved["indices"] == indices and saved["file"] == str(chosen)
    chosen.rename(chosen.with_suffix(".moved"))  # a finished run reads its own copy back
    try:
        done = run_main(evaluate_cli.main, [str(run), "--out", str(tmp_path / "eval.json")])
    finally:
        chosen.with_suffix(".moved").rename(chosen)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "eval.json").read_text())["label_subset"]["indices"] == indices
