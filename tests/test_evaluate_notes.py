"""sslkit-evaluate says what it measured on: k, the labelled images, a k above them, and results it replaced."""

from sslkit.config import load_config
from sslkit.datasets import build_splits
from sslkit.evaluation.evaluate import EvaluationPlan, evaluation_notes


def test_the_notes_name_k_and_the_labelled_subset_and_warn_when_k_exceeds_it(tmp_path):
    cfg = load_config("quickstart", ["eval.label_fraction=0.01", "eval.knn_k=20"])
    splits = build_splits(cfg, train_split="train", for_evaluation=True)
    plan = EvaluationPlan(tmp_path, cfg, tmp_path / "eval.json", replaces=True)
    first, many, replaced = evaluation_notes(plan, splits)
    assert first == "kNN: k=20, T=0.07; kNN memory and linear probe: 10 labelled images (0.01 of the labels (seed 0))"
    assert many.startswith("eval.knn_k=20 is more than the 10 labelled images")
    assert replaced.startswith(f"replaced the earlier results in {tmp_path / 'eval.json'}")


def test_all_labels_and_a_fresh_out_need_no_warning(tmp_path):
    cfg = load_config("quickstart", ["eval.knn_k=5"])
    splits = build_splits(cfg, train_split="train", for_evaluation=True)
    (note,) = evaluation_notes(EvaluationPlan(tmp_path, cfg, tmp_path / "eval.json"), splits)
    assert note == f"kNN: k=5, T=0.07; kNN memory and linear probe: all {len(splits.memory)} labelled training images"
