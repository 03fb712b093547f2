"""End to end, as a user runs it: ``python -m sslkit.cli.pretrain`` in real subprocesses, one process and two
(``accelerate launch --cpu --num_processes 2``), SIGKILL and resume, and every bad input a user
is likely to type, each of which must give one line and leave nothing half-done.

The runs are tiny (digits, a width-4 ResNet-18 on 8x8 crops, a handful of steps) so the whole
file stays around a minute on two cores. Where the command's start is not what a test checks, the run
goes through the command's ``main()`` in the test's process (:func:`pretrain_here`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sslkit.loop import run_directory

ROOT = Path(__file__).resolve().parents[1]
PRETRAIN = ["-m", "sslkit.cli.pretrain"]  # as `accelerate launch -m` and the sweep tools start it
QUICKSTART = ROOT / "recipes" / "quickstart.yaml"

TINY = [
    "model.width=4",
    "model.projector_hidden=32",
    "model.projector_out=16",
    "augment.image_size=8",
    "train.batch_size=64",
    "train.log_every_steps=1",
    "train.threads=1",
    "train.knn_every_epochs=1",
    "eval.linear_epochs=3",
    "eval.compare_random_init=false",
    "optim.warmup_epochs=0",
]


def env() -> dict:
    e = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    e.pop("CUDA_VISIBLE_DEVICES", None)
    return e


def pretrain(
    tmp_path: Path, *overrides: str, recipe: Path = QUICKSTART, launcher: list[str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess:
    command = [
        *(launcher or [sys.executable]),
        *PRETRAIN,
        str(recipe),
        f"run.output_dir={tmp_path}",
        *TINY,
        *overrides,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env(), cwd=tmp_path)


def pretrain_here(tmp_path: Path, *overrides: str, recipe: Path = QUICKSTART) -> subprocess.CompletedProcess:
    """As :func:`pretrain`, through ``sslkit-pretrain``'s ``main()`` in this process: for tests of what a run
    does, where the interpreter's start would cost more than the run (the command itself is tested here)."""
    from sslkit.cli.pretrain import main

    argv = [str(recipe), f"run.output_dir={tmp_path}", *TINY, *overrides]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = main(argv)
    return subprocess.CompletedProcess(argv, status, stdout.getvalue(), stderr.getvalue())


def assert_one_line_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.slow
def test_one_process_run_writes_everything(tmp_path):
    result = pretrain(tmp_path, "run.name=one", "train.epochs=2")
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "one"
    assert (run / "config.yaml").is_file() and (run / "backbone.safetensors").is_file()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert len(steps) == 2 * (1437 // 64) and all(r["loss"] > 0 and r["images_per_s"] > 0 for r in steps)
    assert [(r["step"], r["epoch"]) for r in records if "knn_top1" in r] == [(1437 // 64, 1)]  # after epoch 1 of 2
    # The last step also ends the last epoch: the final record and checkpoint count it (they said epoch 1).
    assert [(r["step"], r["epoch"]) for r in records if "final_knn_top1" in r] == [(2 * (1437 // 64), 2)]
    from sslkit.loop.run_directory import read_progress

    final = json.loads((run / "results.json").read_text())["checkpoint"]
    assert {k: read_progress(Path(final))[k] for k in ("step", "epoch", "batch_in_epoch")} == {
        "step": 2 * (1437 // 64),
        "epoch": 2,
        "batch_in_epoch": 0,
    }
    results = json.loads((run / "results.json").read_text())["results"]["trained"]
    assert 0.0 <= results["knn_top1"] <= 1.0 and "linear_top1" in results
    assert "knn_top1" in result.stdout and "linear_top1" in result.stdout
    # the exported backbone loads into a freshly built model with torchvision's keys
    from sslkit.models import build_backbone

    build_backbone("resnet18", width=4, cifar_stem=True, in_channels=1).load_state_dict(
        load_file(run / "backbone.safetensors")
    )


@pytest.mark.slow
def test_evaluate_a_run_next_to_raw_pixels(tmp_path):
    """``sslkit-evaluate RUN`` as a user types it: overrides before and after the --options."""
    trained = pretrain_here(tmp_path, "run.name=ev", "train.epochs=1", "train.max_steps=2", "eval.linear_epochs=0")
    assert trained.returncode == 0, trained.stderr[-3000:]
    out = tmp_path / "ev.json"
    command = [
        sys.executable,
        "-m",
        "sslkit.cli.evaluate",
        str(tmp_path / "ev"),
        "eval.knn_k=5",
        "--no-linear",
        "--out",
        str(out),
        "eval.compare_raw_pixels=true",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["results"]) == {"knn_top1"} and set(report["raw_pixels"]) == {"knn_top1"}
    assert 0.1 < report["raw_pixels"]["knn_top1"] <= 1.0  # digits: raw-pixel kNN is far above chance
    assert "raw pixels" in result.stdout
    assert_one_line_error(evaluate(tmp_path, str(tmp_path / "nope")), "nope", "not found")


def _tiny_backbone_file(tmp_path: Path) -> tuple[Path, Path]:
    """A width-4 ResNet-18 (CIFAR stem, 1 channel: digits) exported as a run exports it, and a copy of
    the quick-start recipe in a folder of its own (so nothing lands in the source tree)."""
    from sslkit.models import build_backbone
    from sslkit.models.weights import export_backbone

    backbone = export_backbone(
        build_backbone("resnet18", width=4, cifar_stem=True, in_channels=1), tmp_path / "bb.safetensors"
    )
    recipe = tmp_path / "recipes" / "quickstart.yaml"
    recipe.parent.mkdir()
    shutil.copy(QUICKSTART, recipe)
    return backbone, recipe


def evaluate(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``sslkit-evaluate ARGS`` through its ``main()`` in this process (test_evaluate_a_run_next_to_raw_pixels
    runs the command itself), its output as a finished command's."""
    from sslkit.cli.evaluate import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = main(list(args))
    return subprocess.CompletedProcess(args, status, stdout.getvalue(), stderr.getvalue())


@pytest.mark.slow
def test_evaluate_a_backbone_file_writes_next_to_it_not_next_to_the_recipe(tmp_path):
    backbone, recipe = _tiny_backbone_file(tmp_path)
    result = evaluate(
        tmp_path,
        str(backbone),
        "--recipe",
        str(recipe),
        "model.width=4",
        "augment.image_size=8",
        "eval.knn_k=5",
        "eval.compare_raw_pixels=false",
        "--no-linear",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "bb.eval.json"
    assert f"results written to {out}" in result.stdout  # one line in a log, however long the path
    assert json.loads(out.read_text())["target"] == str(backbone)
    assert not (recipe.parent / "eval.json").exists()


@pytest.mark.slow
def test_evaluate_weights_of_another_width_name_the_first_mismatch_in_one_line(tmp_path):
    backbone, recipe = _tiny_backbone_file(tmp_path)
    result = evaluate(tmp_path, str(backbone), "--recipe", str(recipe), "model.width=8", "augment.image_size=8")
    assert_one_line_error(
        result,
        f"the weights in '{backbone}' do not fit model.backbone=resnet18 width=8 cifar_stem=True",
        "(conv1.weight is [4, 1, 3, 3] in the file, [8, 1, 3, 3] in the model, and ",
        "; pass the model.* values the backbone was trained with, or --recipe with its recipe",
    )
    assert result.stderr.strip().endswith("--recipe with its recipe"), result.stderr
    assert not list(tmp_path.rglob("*eval.json"))


@pytest.mark.slow
def test_a_mistake_in_two_processes_is_the_workers_line_and_their_exit_code(tmp_path):
    """torchrun's ChildFailedError traceback (about 45 lines) followed the workers' one-line error."""
    from dist_utils import accelerate_cpu_launcher

    launcher = accelerate_cpu_launcher(quiet=True)
    result = pretrain(tmp_path, "run.name=bad", "train.bogus=1", launcher=launcher, timeout=120)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and all("unknown key 'train.bogus'" in line for line in lines), (
        lines
    )  # one line per process, nothing else
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_two_processes_with_accelerate_launch(tmp_path):
    """Per-process BatchNorm; test_cluster_e2e.py launches two processes with model.sync_batchnorm=true."""
    from dist_utils import accelerate_cpu_launcher

    launcher = accelerate_cpu_launcher()  # on a free port, not 29500: another run may hold it
    compare = ["eval.compare_random_init=true", "eval.linear_epochs=0"]
    result = pretrain(
        tmp_path,
        "run.name=two",
        "train.epochs=1",
        "train.max_steps=4",
        "model.sync_batchnorm=false",
        *compare,
        launcher=launcher,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # The "random init" row scores the starting network every process trained from: the one a
    # single process builds from the same seed, not a different network on each process's share.
    one = pretrain(tmp_path, "run.name=one", "train.epochs=1", "train.max_steps=1", *compare)
    assert one.returncode == 0, one.stderr[-3000:]
    start = [
        json.loads((tmp_path / name / "results.json").read_text())["results"]["random init"] for name in ("two", "one")
    ]
    assert start[0] == start[1]
    assert "BatchNorm over the global batch" not in result.stdout
    run = tmp_path / "two"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]  # written once, by the main process
    assert "2 processes" in result.stdout  # really two (accelerate alone would start one: sslkit/loop/launch.py)
    assert (run / "backbone.safetensors").is_file()


def _wait_for(path_glob: Path, pattern: str, process: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if list(path_glob.glob(pattern)):
            return
        if process.poll() is not None:
            raise AssertionError(f"run ended before {pattern} appeared: {process.stderr.read()[-2000:]}")
        time.sleep(0.05)
    raise AssertionError(f"{pattern} did not appear in {timeout} s")


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_gives_identical_weights(tmp_path):
    common = ["train.epochs=2", "train.checkpoint_every_steps=3", "train.knn_every_epochs=1"]
    reference = pretrain_here(tmp_path, "run.name=straight", *common)  # only the killed run needs a process
    assert reference.returncode == 0, reference.stderr[-3000:]

    command = [
        sys.executable,
        *PRETRAIN,
        str(QUICKSTART),
        f"run.output_dir={tmp_path}",
        *TINY,
        "run.name=killed",
        *common,
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env(), cwd=tmp_path
    )
    # 22 batches an epoch: step 3 is early in epoch 0, so the kill lands mid-epoch
    _wait_for(tmp_path / "killed" / "checkpoints", "step-00000003", process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "killed" / "backbone.safetensors").exists()

    resumed = pretrain_here(tmp_path, "run.name=killed", "run.resume=auto", *common)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    # the steps the killed run logged after its last checkpoint are logged once, by the resumed run
    logged = [
        json.loads(line)["step"]
        for line in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()
        if '"loss"' in line
    ]
    assert logged == sorted(set(logged)), logged
    straight = load_file(tmp_path / "straight" / "backbone.safetensors")
    again = load_file(tmp_path / "killed" / "backbone.safetensors")
    assert straight.keys() == again.keys()
    for key in straight:
        assert torch.equal(straight[key], again[key]), key


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_the_run_resumes(tmp_path):
    command = [
        sys.executable,
        *PRETRAIN,
        str(QUICKSTART),
        f"run.output_dir={tmp_path}",
        *TINY,
        "run.name=stopped",
        "train.epochs=2",
        "train.checkpoint_every_steps=2",
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=tmp_path,
        # Ctrl-C as a terminal delivers it: a test runner's worker (pytest-xdist) may ignore SIGINT, and an
        # ignored signal stays ignored in the processes it starts.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    _wait_for(tmp_path / "stopped" / "checkpoints", "step-00000002", process)
    process.send_signal(signal.SIGINT)
    stderr = process.communicate(timeout=60)[1]
    assert process.returncode == 130
    last_line = stderr.strip().splitlines()[-1]
    assert "Traceback" not in stderr and last_line.startswith("interrupted: run.resume=auto continues from "), stderr
    newest = sorted((tmp_path / "stopped" / "checkpoints").glob("step-*"))[-1]
    assert last_line.endswith(f"{newest.relative_to(tmp_path)} (step {int(newest.name.split('-')[1])})"), stderr
    resumed = pretrain_here(
        tmp_path, "run.name=stopped", "run.resume=auto", "train.epochs=2", "train.checkpoint_every_steps=2"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout


def _one_run_per_directory(tmp_path: Path, run: Path) -> None:
    """A second fresh run into a run's directory, or a resume that changes the model, is one line and changes
    nothing."""
    before = {p.relative_to(run): p.stat().st_mtime_ns for p in run.rglob("*")}
    # In this process: both are refused before the run starts (the command's own process is tested above).
    again = pretrain_here(tmp_path, f"run.name={run.name}", "train.epochs=1", "train.max_steps=2")
    assert_one_line_error(again, "already holds a run", "checkpoints up to step 2", "run.resume=auto", "run.name=")
    wider = pretrain_here(tmp_path, f"run.name={run.name}", "run.resume=auto", "model.width=8")
    assert_one_line_error(wider, "model.width=4", "model.width=8", "another run.name")
    assert {p.relative_to(run): p.stat().st_mtime_ns for p in run.rglob("*")} == before


@pytest.mark.slow
def test_interrupted_save_leaves_last_checkpoint_usable(tmp_path):
    """A half-written checkpoint (.tmp-*) is ignored by resume and cleaned by the next save. The runs are
    processes: Accelerate keeps one precision per process, and an earlier run in this one set fp32."""
    first = pretrain(
        tmp_path,
        "run.name=crash",
        "train.epochs=1",
        "train.max_steps=2",
        "train.checkpoint_every_steps=1",
        "train.mixed_precision=fp16",
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert "fp16 has no effect on the CPU" in first.stdout  # not silently fp32
    _one_run_per_directory(tmp_path, tmp_path / "crash")
    checkpoints = tmp_path / "crash" / "checkpoints"
    half = checkpoints / ".tmp-step-00000099"
    shutil.copytree(checkpoints / "step-00000002", half)
    (half / "progress.json").unlink()
    (half / "model.safetensors").write_bytes(b"\0" * 10)  # torn write
    resumed = pretrain(
        tmp_path,
        "run.name=crash",
        "run.resume=auto",
        "train.epochs=1",
        "train.max_steps=3",
        "train.checkpoint_every_steps=1",
        "train.mixed_precision=fp16",
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "step 2" in resumed.stdout
    assert "train.max_steps 2 -> 3" in resumed.stdout  # what changed since the run began is said
    assert not half.exists()


@pytest.mark.slow
def test_bad_input_from_the_command_gives_one_line_and_writes_nothing(tmp_path):
    result = pretrain(tmp_path, "run.name=bad", "train.epoch=3", timeout=120)
    assert_one_line_error(result, "unknown key 'train.epoch'", "epochs")
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize(
    "overrides, words",
    [
        (
            ["data.name=fashion_mnist", "data.root=/nonexistent/fmnist"],
            ["/nonexistent/fmnist", "dataset-fashion-mnist"],
        ),
        (["train.batch_size=4096"], ["train.batch_size", "1437"]),
        (["data.holdout_classes=[0,1,2,3,4,5,6,7,8,9]"], ["holds out all 10 classes", "digits"]),
    ],
)
def test_bad_data_input_gives_one_line_and_writes_nothing(tmp_path, overrides, words):
    """Mistakes found when the data is built, through main() in this process (the test above runs the command)."""
    result = pretrain_here(tmp_path, "run.name=bad", *overrides)
    assert_one_line_error(result, *words)
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["train.epochs=three"], ["'train.epochs' must be int"]),
        (["loss.temperature=0"], ["temperature", "> 0"]),
        (["loss.name=arc"], ["unknown loss.name 'arc'"]),
        (["--epochs", "3"], ["unknown option '--epochs'", "train.epochs=3"]),  # as other trainers spell it
        (["train.threads=0"], ["train.threads", ">= 1"]),
        (["train.max_steps=0"], ["train.max_steps", ">= 1"]),  # would train nothing and call it trained
        (["train.keep_checkpoints=-1"], ["train.keep_checkpoints", ">= 1"]),
        (["train.freeze_backbone_epochs=-1"], ["train.freeze_backbone_epochs", ">= 0"]),
    ],
)
def test_recipe_mistakes_are_one_line_before_any_work(tmp_path, capsys, overrides, words):
    """Mistakes the recipe check catches, through pretrain.py's main() in this process (they stop
    before the trainer, so nothing of this process's torch or Accelerate state is touched; the
    subprocess cases above cover the command itself)."""
    from sslkit.cli.pretrain import main

    code = main([str(QUICKSTART), f"run.output_dir={tmp_path}", *TINY, "run.name=bad", *overrides])
    assert code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    for word in words:
        assert word in lines[0], lines[0]
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_logged_loss_averages_the_batches_a_short_accumulation_window_had(tmp_path):
    """22 batches an epoch and grad_accum_steps=50: one step of 22 batches. Its logged loss is their
    mean (about the loss at init, as in a plain run's first step), not their sum over 50."""

    def first_loss(name: str, *overrides: str) -> float:
        result = pretrain_here(
            tmp_path,
            f"run.name={name}",
            "train.epochs=1",
            "train.knn_every_epochs=0",
            "eval.linear_epochs=0",
            *overrides,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return next(
            json.loads(line)
            for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line
        )["loss"]

    accumulated = first_loss("accumulated", "train.grad_accum_steps=50")
    plain = first_loss("plain", "train.max_steps=1")
    assert 0.8 < accumulated / plain < 1.25, (accumulated, plain)  # the old division by 50: 0.44


@pytest.mark.slow
def test_corrupt_image_in_folder_names_the_file(tmp_path):
    from PIL import Image

    for split in ("train", "test"):
        for cls in ("cats", "dogs"):
            folder = tmp_path / "images" / split / cls
            folder.mkdir(parents=True)
            for i in range(40 if split == "train" else 4):
                Image.new("RGB", (12, 12), (i * 6, 100, 200 if cls == "cats" else 0)).save(folder / f"{i}.png")
    (tmp_path / "images" / "train" / "dogs" / "broken.png").write_bytes(b"this is not a png")
    result = pretrain_here(
        tmp_path,
        "run.name=folder",
        "data.name=imagefolder",
        f"data.root={tmp_path / 'images'}",
        "data.image_size=12",
        "train.batch_size=16",
        "augment.saturation=0.4",
    )
    assert_one_line_error(result, "broken.png")
    assert not list((tmp_path / "folder").glob("checkpoints/step-*"))


@pytest.mark.slow
def test_nan_loss_stops_with_checkpoint_intact(tmp_path):
    result = pretrain_here(
        tmp_path,
        "run.name=nan",
        "train.epochs=1",
        "optim.name=sgd",
        "optim.lr=1e30",
        "train.checkpoint_every_steps=1",
        "optim.exclude_bias_and_norm=false",
    )
    assert_one_line_error(result, "loss became", "optim.lr")
    checkpoints = sorted((tmp_path / "nan" / "checkpoints").glob("step-*"))
    assert checkpoints, "the last good checkpoint should remain"
    state = load_file(checkpoints[-1] / "model.safetensors")
    assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())
    assert not (tmp_path / "nan" / "backbone.safetensors").exists()


def test_a_run_directory_under_a_file_is_one_line_before_any_work(tmp_path):
    """mkdir under a file failed with a traceback once the data and model were built."""
    from sslkit.errors import UserError
    from sslkit.loop.run_directory import check_run_directory

    (tmp_path / "afile").write_text("")
    for resume in (None, "auto"):
        with pytest.raises(
            UserError, match=r"cannot be made: .*afile is a file; choose another run.output_dir or run.name"
        ):
            check_run_directory(tmp_path / "afile" / "runs" / "x", resume, {})
    assert check_run_directory(tmp_path / "fine" / "x", None, {}) == []


def test_ctrl_c_before_the_first_checkpoint_does_not_promise_one(tmp_path):
    from sslkit.cli.pretrain import interrupted_message
    from sslkit.config import config_from_dict
    from sslkit.models.weights import PROGRESS_FILE

    cfg = config_from_dict({"run": {"name": "early", "output_dir": str(tmp_path)}})
    assert interrupted_message(cfg).startswith("interrupted before the first checkpoint: nothing to continue from")
    assert interrupted_message(None).startswith(
        "interrupted before the first checkpoint"
    )  # the recipe was still loading
    step = tmp_path / "early" / "checkpoints" / "step-00000002"
    step.mkdir(parents=True)
    (step / PROGRESS_FILE).write_text('{"step": 2, "epoch": 1, "batch_in_epoch": 0}')
    assert interrupted_message(cfg) == f"interrupted: run.resume=auto continues from {step} (step 2)"


def test_trim_metrics_keeps_the_steps_up_to_the_checkpoint_and_drops_the_final_record(tmp_path):
    lines = [{"step": 10, "loss": 1.0}, {"step": 20, "loss": 0.5}, {"step": 20, "final_knn_top1": 0.9}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 2')  # torn
    run_directory.trim_metrics(tmp_path, 20)
    assert [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == lines[:2]
    run_directory.trim_metrics(tmp_path, 10)
    assert [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == lines[:1]
