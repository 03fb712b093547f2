"""The road from self-supervised to supervised, as a user runs it: SimCLR -> SupCon -> a head,
each stage starting from the previous run with ``run.init_from``, on seen classes, with
retrieval among held-out classes reported; and the mistakes a user makes on that road.

Every run goes through ``sslkit-pretrain``'s ``main()`` in this process (test_pretrain_e2e.py runs the
command itself)."""

from __future__ import annotations

import json

import pytest
from test_pretrain_e2e import assert_one_line_error
from test_pretrain_e2e import pretrain_here as pretrain

pytestmark = pytest.mark.slow  # every test trains, or builds the data and model of a run

HOLDOUT = "data.holdout_classes=[5, 6, 7, 8, 9]"


def stage_recipe(tmp_path, name: str, method: dict, loss: dict):
    """The quickstart recipe with another method and loss section, as a user writes a stage recipe."""
    import yaml
    from test_pretrain_e2e import QUICKSTART

    recipe = yaml.safe_load(QUICKSTART.read_text())
    recipe.update(method=method, loss=loss)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def results(run) -> dict:
    return json.loads((run / "results.json").read_text())["results"]["trained"]


def test_three_stage_chain_with_unseen_class_retrieval(tmp_path):
    first = pretrain(tmp_path, "run.name=ssl", HOLDOUT, "train.epochs=1", "train.batch_size=64")
    assert first.returncode == 0, first.stderr[-3000:]
    supcon = stage_recipe(tmp_path, "supcon", {"name": "supcon"}, {"name": "supcon", "temperature": 0.1})
    second = pretrain(
        tmp_path, "run.name=supcon", HOLDOUT, "train.epochs=1", f"run.init_from={tmp_path / 'ssl'}", recipe=supcon
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert "backbone initialised from" in second.stdout
    head = stage_recipe(tmp_path, "head", {"name": "supervised"}, {"name": "proxy_anchor"})
    third = pretrain(
        tmp_path,
        "run.name=head",
        HOLDOUT,
        "train.epochs=2",
        f"run.init_from={tmp_path / 'supcon'}",
        "train.freeze_backbone_epochs=1",
        recipe=head,
    )
    assert third.returncode == 0, third.stderr[-3000:]
    for name in ("ssl", "supcon", "head"):
        metrics = results(tmp_path / name)
        assert {"knn_top1", "unseen_recall@1", "unseen_map@r", "unseen_nmi"} <= metrics.keys()
        assert 0 <= metrics["unseen_recall@1"] <= 1
    # retrieval runs on the held-out classes only; kNN on the seen ones (5 classes: above chance 0.2 by a margin)
    assert results(tmp_path / "head")["knn_top1"] > 0.3


def test_init_from_mistakes_are_one_line(tmp_path):
    missing = pretrain(tmp_path, "run.name=a", "run.init_from=/nonexistent/run", "train.max_steps=1")
    assert_one_line_error(missing, "run.init_from '/nonexistent/run' not found", "a relative path starts from")
    assert not (tmp_path / "a").exists()
    # linear_epochs=0: kNN only, no linear probe (and no crash at the end of training)
    source = pretrain(tmp_path, "run.name=src", "train.epochs=1", "train.max_steps=1", "eval.linear_epochs=0")
    assert source.returncode == 0, source.stderr[-3000:]
    assert "knn_top1" in results(tmp_path / "src") and "linear_top1" not in results(tmp_path / "src")
    wider = pretrain(tmp_path, "run.name=b", f"run.init_from={tmp_path / 'src'}", "model.width=8", "train.max_steps=1")
    assert_one_line_error(wider, "does not fit", "shape mismatch")
    assert not (tmp_path / "b").exists()


def test_head_and_label_mistakes_are_one_line(tmp_path):
    head = stage_recipe(tmp_path, "head", {"name": "supervised"}, {"name": "proxy_anchor", "num_classes": 7})
    classes = pretrain(tmp_path, "run.name=c", recipe=head)
    assert_one_line_error(classes, "loss.num_classes is 7", "10 classes")
    wrong_kind = pretrain(tmp_path, "run.name=d", "method.name=supcon")
    assert_one_line_error(wrong_kind, "needs a label loss")
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


def test_label_method_on_unlabelled_split_is_one_line(tmp_path):
    from test_data import write_stl10

    write_stl10(tmp_path / "stl", n_train=70, n_test=10, n_unlabeled=70)
    supcon = stage_recipe(tmp_path, "supcon", {"name": "supcon"}, {"name": "supcon"})
    result = pretrain(
        tmp_path,
        "run.name=e",
        "data.name=stl10",
        f"data.root={tmp_path / 'stl'}",
        "data.train_split=unlabeled",
        recipe=supcon,
    )
    assert_one_line_error(result, "needs labels", "unlabeled")
    assert not (tmp_path / "e").exists()


def test_nce_memory_bank_method_trains_through_the_trainer(tmp_path):
    """NPID's bank needs each sample's index: the trainer passes it to methods that declare needs_indices."""
    recipe = stage_recipe(tmp_path, "nce", {"name": "nce", "num_negatives": 64}, {"name": "nce", "temperature": 0.07})
    result = pretrain(tmp_path, "run.name=nce", "train.epochs=1", "train.max_steps=3", recipe=recipe)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "knn_top1" in results(tmp_path / "nce")


def test_init_from_reaches_the_momentum_encoder(tmp_path):
    """MoCo copies its backbone into the key encoder when built: init_from must load before that."""
    import torch
    from safetensors.torch import load_file

    source = pretrain(tmp_path, "run.name=src", "train.epochs=1", "train.max_steps=1", "eval.linear_epochs=1")
    assert source.returncode == 0, source.stderr[-3000:]
    recipe = stage_recipe(
        tmp_path,
        "moco",
        {"name": "moco", "queue_size": 256, "momentum": 1.0, "momentum_final": 1.0},
        {"name": "ntxent", "temperature": 0.2},
    )
    run = pretrain(
        tmp_path,
        "run.name=moco",
        f"run.init_from={tmp_path / 'src'}",
        "train.epochs=1",
        "train.max_steps=1",
        "optim.lr=1e-12",
        recipe=recipe,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    state = load_file(sorted((tmp_path / "moco" / "checkpoints").glob("step-*"))[-1] / "model.safetensors")
    exported = load_file(tmp_path / "src" / "backbone.safetensors")
    # momentum 1.0 keeps the key encoder exactly where it started: at the init_from weights
    assert torch.equal(state["momentum_backbone.conv1.weight"], exported["conv1.weight"])
