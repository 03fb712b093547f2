"""Fine-tuning with few labels, end to end as a user runs it: pretrain, fine-tune from it, train the
same network from scratch on the same labelled images, distil; in one process and in two.

Tiny runs (digits, a width-4 ResNet-18 on 8x8 crops) so the file stays around a minute. The one-process runs
go through ``sslkit-pretrain``'s ``main()`` in this process (the command's own start is tested in
test_pretrain_e2e.py); the two-process run is two real processes, ranked as srun and torchrun rank them (the
launchers are tested in test_pretrain_e2e.py and test_preemption_e2e.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from dist_utils import run_as_ranks
from safetensors.torch import load_file

from sslkit import datasets, models
from sslkit.augment import EvalTransform
from sslkit.cli.evaluate import main as evaluate_main
from sslkit.cli.pretrain import main as pretrain_main
from sslkit.config import load_config
from sslkit.evaluation import evaluate_encoder
from sslkit.methods import METHODS, build_method

PRETRAIN = "sslkit.cli.pretrain"
TINY = [
    "model.width=4",
    "augment.image_size=8",
    "train.threads=1",
    "eval.linear_epochs=3",
    "eval.batch_size=7",  # uneven last batches: two processes pad them, and no sample may count twice
]
SSL_TINY = ["model.projector_hidden=32", "model.projector_out=16", "train.batch_size=64", "train.epochs=1"]
FINETUNE = ["data.label_fraction=0.1", "train.epochs=2", "train.batch_size=16", "optim.warmup_epochs=0"]

pytestmark = pytest.mark.slow


def pretrain(*argv: str) -> None:
    """``sslkit-pretrain ARGV`` in this process."""
    assert pretrain_main(list(argv)) == 0


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pretrained")
    pretrain("quickstart", f"run.output_dir={out}", "run.name=ssl", *TINY, *SSL_TINY)
    return out / "ssl"


def hand_top1(run_dir: Path) -> tuple[float, int]:
    """The fine-tuned classifier's test top-1, computed here from its checkpoint (argmax of its logits),
    and how many of the 360 test images are near-ties (top-2 logits within 1e-4), whose argmax may
    differ between batch compositions in the last float bits."""
    cfg = load_config(run_dir / "config.yaml")
    test = datasets.build_dataset("digits", "test")
    info = test.info
    backbone = models.build_backbone(cfg.model.backbone, cfg.model.width, cfg.model.cifar_stem, info.channels)
    method = build_method(cfg, backbone, info.num_classes)
    checkpoint = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    method.load_state_dict(load_file(str(checkpoint / "model.safetensors")))
    preprocess = EvalTransform(cfg.augment.image_size, info.channels, info.mean, info.std, cfg.augment.normalize)
    with torch.no_grad():
        logits = method.eval().logits(preprocess(test.images))  # (360, 10)
    top2 = logits.topk(2, dim=1).values
    near_ties = int((top2[:, 0] - top2[:, 1] < 1e-4).sum())
    return (logits.argmax(dim=1) == test.labels).double().mean().item(), near_ties


def assert_own_top1(run_dir: Path) -> None:
    """results.json's finetune_top1 is the argmax accuracy over the 360 test images, each counted once."""
    reported = results(run_dir)["finetune_top1"]
    expected, near_ties = hand_top1(run_dir)
    correct = reported * 360
    assert correct == pytest.approx(round(correct), abs=1e-9)  # a count out of exactly 360 images
    assert abs(round(correct) - round(expected * 360)) <= near_ties, (reported, expected, near_ties)


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())["results"]["trained"]


def test_finetune_and_scratch_see_the_same_labels_and_score_their_own_classifier(pretrained, tmp_path, capsys):
    common = ["quickstart_finetune", f"run.output_dir={tmp_path}", *TINY, *FINETUNE]
    pretrain(*common, "run.name=ft", f"run.init_from={pretrained}")
    capsys.readouterr()
    pretrain(*common, "run.name=scratch")
    assert "trains from scratch" in capsys.readouterr().out
    subsets = [json.loads((tmp_path / name / "label_subset.json").read_text()) for name in ("ft", "scratch")]
    assert subsets[0] == subsets[1] and len(subsets[0]["indices"]) == 140
    for name in ("ft", "scratch"):
        assert_own_top1(tmp_path / name)


def test_two_processes_count_every_test_sample_once(pretrained, tmp_path):
    args = ["quickstart_finetune", f"run.output_dir={tmp_path}", "run.name=two", f"run.init_from={pretrained}"]
    command = [sys.executable, "-m", PRETRAIN, *args, *TINY, *FINETUNE]
    result = run_as_ranks(command, env=dict(os.environ), cwd=tmp_path)
    assert result.returncode == 0 and "2 processes" in result.stdout, result.stderr[-3000:]
    assert_own_top1(tmp_path / "two")


def test_resume_and_evaluate_read_the_saved_subset_back(pretrained, tmp_path):
    args = ["quickstart_finetune", f"run.output_dir={tmp_path}", "run.name=r", *TINY, *FINETUNE]
    pretrain(*args, "train.epochs=1")
    saved_file = tmp_path / "r" / "label_subset.json"
    saved = json.loads(saved_file.read_text())
    # Another valid subset of the same spec (the last 14 images of each class): a resumed run and
    # evaluate.py must use the file, not a fresh draw.
    labels = datasets.build_dataset("digits", "train").labels
    edited = sorted(i for c in range(10) for i in (labels == c).nonzero().flatten()[-14:].tolist())
    assert edited != saved["indices"]
    saved_file.write_text(json.dumps({**saved, "indices": edited}))
    pretrain(*args, "train.epochs=2", "run.resume=auto")
    assert json.loads(saved_file.read_text())["indices"] == edited
    assert evaluate_main([str(tmp_path / "r"), "--out", str(tmp_path / "e.json"), "eval.batch_size=64"]) == 0
    written = json.loads((tmp_path / "e.json").read_text())
    assert written["label_subset"]["indices"] == edited
    # The command's evaluation from Python: the same figures (kNN alone here), its JSON where asked.
    out = tmp_path / "k.json"
    evaluation = evaluate_encoder(tmp_path / "r", overrides=["eval.batch_size=64"], out=out, linear=False)
    assert evaluation.results["encoder"]["knn_top1"] == written["results"]["knn_top1"]
    assert "linear_top1" not in evaluation.report["results"]
    assert json.loads(out.read_text()) == evaluation.report


def test_distill_student_learns_from_a_finetuned_teacher(pretrained, tmp_path):
    common = [f"run.output_dir={tmp_path}", *TINY, *FINETUNE]
    pretrain("quickstart_finetune", *common, "run.name=teacher", f"run.init_from={pretrained}")
    distill = [f"method.teacher={tmp_path / 'teacher'}", f"run.init_from={pretrained}", "train.batch_size=64"]
    pretrain("quickstart_distill", *common, *distill, "run.name=student", "train.epochs=1")
    student = tmp_path / "student"
    assert_own_top1(student)
    # The student trained on every image (1437 // 64 batches), not only the 140 labelled ones.
    steps = [json.loads(line) for line in (student / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in steps) == 1437 // 64


def test_distill_without_a_teacher_and_a_teacher_without_a_classifier_are_one_line(pretrained, tmp_path, capsys):
    """Through pretrain.py's main() in this process, as the projector mistakes below."""
    for teacher, words in ((None, "needs method.teacher"), (pretrained, "has no classifier")):
        extra = [f"method.teacher={teacher}"] if teacher else []
        assert pretrain_main(["quickstart_distill", f"run.output_dir={tmp_path}", *TINY, *extra]) == 2
        stderr = capsys.readouterr().err
        assert words in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not (tmp_path / "quickstart-distill").exists()  # nothing written


def test_finetune_from_the_projectors_first_layer_keeps_its_pretrained_weights(pretrained, tmp_path):
    """SimCLRv2's fine-tuning from the first projector layer: backbone -> Linear, BatchNorm, ReLU of the
    pretrained projector -> classifier, the layer starting from the pretraining's weights."""
    keep = ["method.finetune_from_projector_layer=1", "model.projector_hidden=32", "model.projector_out=16"]
    cfg = load_config("quickstart_finetune", [*TINY, *FINETUNE, *keep, f"run.init_from={pretrained}"])
    backbone = models.build_backbone(cfg.model.backbone, cfg.model.width, cfg.model.cifar_stem, 1)
    method = METHODS["finetune"].from_config(cfg, backbone, 10)
    method.start_from(cfg.run.init_from)
    saved = load_file(str(sorted((pretrained / "checkpoints").glob("step-*"))[-1] / "model.safetensors"))
    for name, value in method.projector.state_dict().items():
        assert torch.equal(value, saved[f"projector.{name}"]), name
    assert [type(m) for m in method.projector] == [torch.nn.Linear, torch.nn.BatchNorm1d, torch.nn.ReLU]
    images = torch.randn(5, 1, 8, 8)
    linear, norm, _ = method.eval().projector
    expected = method.head.logits(torch.relu(norm(linear(method.backbone(images)))))
    assert torch.allclose(method.logits(images), expected)
    # End to end: it trains, and its reported top-1 is its own classifier's, the kept layer included.
    common = ["quickstart_finetune", f"run.output_dir={tmp_path}", *TINY, *FINETUNE, *keep]
    pretrain(*common, "run.name=v2", f"run.init_from={pretrained}")
    assert_own_top1(tmp_path / "v2")


@pytest.mark.parametrize(
    "change, words",
    [
        (["method.finetune_from_projector_layer=2"], ["must be in [0, 1] for a 2-layer projector"]),
        (
            ["model.projector_hidden=24"],
            ["projector's 0.weight is (32, 32), this recipe's (24, 32)", "model.projector_hidden"],
        ),
        (["from-export"], ["holds none", "not an exported backbone"]),
    ],
)
def test_finetune_from_a_projector_that_is_not_there_is_one_line(pretrained, tmp_path, capsys, change, words):
    """Through pretrain.py's main() in this process: the interpreter's start would cost more than the check."""
    from sslkit.cli.pretrain import main

    keep = ["method.finetune_from_projector_layer=1", "model.projector_hidden=32", "model.projector_out=16"]
    source = pretrained / "backbone.safetensors" if change == ["from-export"] else pretrained
    overrides = [*keep, *(c for c in change if c != "from-export"), f"run.init_from={source}"]
    assert main(["quickstart_finetune", f"run.output_dir={tmp_path}", *TINY, *overrides]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and all(word in lines[0] for word in words), lines
    assert not (tmp_path / "quickstart-finetune").exists()  # nothing written
