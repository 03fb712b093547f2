"""FixMatch end to end as a user runs it: from a tiny pretrained quick-start encoder, one process, a run killed
with SIGKILL and resumed, and two processes, ranked as srun and torchrun rank them.

Digits with 5% of the labels, a width-4 ResNet-18 on 8x8 crops, a batch of 16 labelled and 112 unlabelled
images: an epoch is 1437 // 112 = 12 steps.
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dist_utils import run_as_ranks
from safetensors.torch import load_file
from test_pretrain_e2e import PRETRAIN, _wait_for, env

from sslkit import datasets
from sslkit.augment import EvalTransform
from sslkit.cli.pretrain import main
from sslkit.config import load_config
from sslkit.methods import build_method, load_teacher
from sslkit.models import backbone_from_config

pytestmark = pytest.mark.slow

TINY = ["model.width=4", "augment.image_size=8", "train.threads=1", "eval.linear_epochs=0", "eval.batch_size=64"]
SSL = ["model.projector_hidden=32", "model.projector_out=16", "train.batch_size=64", "train.epochs=1"]
FIXMATCH = ["train.batch_size=16", "train.epochs=3", "train.log_every_steps=1", "train.checkpoint_every_steps=3"]
STEPS = 3 * (1437 // (7 * 16))


def pretrain(tmp_path: Path, *args: str, processes: int = 1) -> subprocess.CompletedProcess:
    """A run of ``processes`` real processes, or of one through sslkit-pretrain's main() in this process (the
    killed run below is the process of its own that these tests need)."""
    if processes == 1:
        argv = [*args, f"run.output_dir={tmp_path}", *TINY]
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            status = main(argv)
        result = subprocess.CompletedProcess(argv, status, stdout.getvalue(), stderr.getvalue())
    else:
        command = [sys.executable, *PRETRAIN, *args, f"run.output_dir={tmp_path}", *TINY]
        result = run_as_ranks(command, env=env(), cwd=tmp_path, world=processes)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("encoder")
    pretrain(out, "quickstart", "run.name=ssl", *SSL)
    return out / "ssl"


@pytest.fixture(scope="module")
def straight(encoder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fixmatch")
    pretrain(out, "quickstart_fixmatch", "run.name=straight", f"run.init_from={encoder}", *FIXMATCH)
    return out / "straight"


def last_checkpoint(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(sorted((run / "checkpoints").glob("step-*"))[-1] / "model.safetensors"))


def own_top1(run: Path) -> float:
    """The run's classifier (the weight average's logits) on the 360 test digits, computed here."""
    cfg = load_config(run / "config.yaml")
    test = datasets.build_dataset("digits", "test")
    info = test.info
    method = build_method(cfg, backbone_from_config(cfg.model, info.channels), info.num_classes)
    method.load_state_dict(last_checkpoint(run))
    preprocess = EvalTransform(cfg.augment.image_size, info.channels, info.mean, info.std, cfg.augment.normalize)
    with torch.no_grad():
        logits = method.eval().logits(preprocess(test.images))
    return (logits.argmax(dim=1) == test.labels).double().mean().item()


def check_fixmatch_metrics(logged: list[dict], lambda_u: float) -> None:
    """FixMatch's figures in its log lines: the mask rate, a share; the two terms, which make the loss; the decay."""
    for r in logged:
        assert 0 <= r["mask_rate"] <= 1 and r["supervised_loss"] > 0
        assert r["loss"] == pytest.approx(r["supervised_loss"] + lambda_u * r["unlabelled_loss"], rel=1e-5)
        assert (r["unlabelled_loss"] > 0) == (r["mask_rate"] > 0)  # no pseudo-label kept: nothing to learn from
    assert [r["ema_decay"] for r in logged[:2]] == [min(0.999, 1 / 10), min(0.999, 2 / 11)]


def test_fixmatch_trains_and_evaluates_and_exports_the_weight_average(encoder, straight):
    logged = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert [r["step"] for r in logged] == list(range(1, STEPS + 1))  # an epoch: one pass over the 1437 images
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in logged)
    check_fixmatch_metrics(logged, lambda_u=1.0)
    state, exported = last_checkpoint(straight), load_file(str(straight / "backbone.safetensors"))
    for key, value in exported.items():
        assert torch.equal(value, state[f"backbone.{key}"]), key  # the export is the average...
    assert any(not torch.equal(v, state[f"student.backbone.{k}"]) for k, v in exported.items())  # ...not the student
    start = load_file(str(encoder / "backbone.safetensors"))
    assert any(not torch.equal(v, start[k]) for k, v in exported.items())  # and it moved from the encoder
    results = json.loads((straight / "results.json").read_text())["results"]["trained"]
    assert results["finetune_top1"] == pytest.approx(own_top1(straight), abs=1 / 360)
    assert json.loads((straight / "label_subset.json").read_text())["fraction"] == 0.05


def test_a_run_killed_mid_epoch_resumes_to_the_same_weights(encoder, straight, tmp_path):
    command = [sys.executable, *PRETRAIN, "quickstart_fixmatch", f"run.output_dir={tmp_path}", *TINY]
    command += ["run.name=killed", f"run.init_from={encoder}", *FIXMATCH]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env(), cwd=tmp_path
    )
    killed = tmp_path / "killed"
    _wait_for(killed / "checkpoints", "step-00000003", process)  # step 3 of the 12 of epoch 0
    process.send_signal(signal.SIGKILL)
    process.wait()
    saved = sorted((killed / "checkpoints").glob("step-*"))
    assert json.loads((saved[-1] / "progress.json").read_text())["step"] < STEPS
    assert not (killed / "backbone.safetensors").exists()

    resumed = pretrain(tmp_path, "quickstart_fixmatch", "run.name=killed", f"run.init_from={encoder}", *FIXMATCH,
                       "run.resume=auto")  # fmt: skip
    assert "resumed from" in resumed.stdout
    again, reference = last_checkpoint(killed), last_checkpoint(straight)
    assert again.keys() == reference.keys() and any(k.startswith("student.") for k in again)
    for key in reference:  # the student and its average alike
        assert torch.equal(again[key], reference[key]), key


def test_two_processes_train_on_shares_of_both_streams(encoder, tmp_path):
    args = ["quickstart_fixmatch", "run.name=two", f"run.init_from={encoder}", *FIXMATCH, "train.epochs=1"]
    result = pretrain(tmp_path, *args, "method.lambda_u=0.5", processes=2)
    assert "2 processes" in result.stdout and "8 images per process per batch" in result.stdout
    run = tmp_path / "two"
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert [r["step"] for r in logged] == list(range(1, STEPS // 3 + 1))  # the same 12 steps an epoch as one process
    check_fixmatch_metrics(logged, lambda_u=0.5)  # each figure averaged over both processes, as the loss is
    assert all(f"mask_rate {r['mask_rate']:.4g}" in result.stdout for r in logged)  # the log's lines show it
    results = json.loads((run / "results.json").read_text())["results"]["trained"]
    assert results["finetune_top1"] == pytest.approx(own_top1(run), abs=1 / 360)


def test_a_distilled_student_learns_from_the_weight_average(encoder, straight, tmp_path):
    """The distillation road can start from FixMatch: ``method.teacher`` names the run, and the teacher whose
    predictions the student learns is the average that FixMatch evaluates and exports, not its student."""
    teacher = load_teacher(str(straight), num_classes=10, in_channels=1)
    images = torch.rand(6, 1, 8, 8)
    state = last_checkpoint(straight)
    cfg = load_config(straight / "config.yaml")
    fixmatch = build_method(cfg, backbone_from_config(cfg.model, 1), 10)
    fixmatch.load_state_dict(state)
    with torch.no_grad():
        assert torch.equal(teacher.logits(images), fixmatch.eval().logits(images))
        assert not torch.equal(teacher.logits(images), fixmatch.student(images))
    args = ["quickstart_distill", "run.name=student", f"method.teacher={straight}", f"run.init_from={encoder}"]
    pretrain(tmp_path, *args, "train.batch_size=64", "train.epochs=1")
    student = tmp_path / "student"
    steps = [json.loads(line)["step"] for line in (student / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 1437 // 64  # every training image, labelled or not
    assert "finetune_top1" in json.loads((student / "results.json").read_text())["results"]["trained"]
