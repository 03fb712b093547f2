"""sslkit-compare: a tiny comparison of two recipes on digits (calibration, budget, pretraining, fine-tune,
scratch), its resume, and the mistakes that must fail before anything runs.

The runs are the commands the comparison builds (``python -m sslkit.cli.pretrain ...``), executed in
this process by calling the module's ``main`` with the same arguments (tests/command_utils.py), so that
the file costs no Python start-ups: the subprocess runner itself is tested in tests/test_runner.py.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml
from command_utils import jobs_in_this_process, read_csv, run_main

from sslkit.cli.compare import main
from sslkit.experiments import calibration, compare
from sslkit.experiments.runs import default_recipe, trained_run

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "model.width=4",
    "model.projector_hidden=32",
    "model.projector_out=16",
    "augment.image_size=8",
    "train.batch_size=64",
    "train.threads=1",
    "eval.linear_epochs=2",
    "eval.compare_random_init=false",
    "eval.compare_raw_pixels=false",
    "optim.warmup_epochs=0",
]
ARGV = [
    "quickstart",
    "quickstart_byol",
    *TINY,
    "--minutes",
    "0.01",
    "--calibration-steps",
    "2",
    "--fraction",
    "0.1",
    "--seeds-for",
    "quickstart=2",
    "--finetune-override",
    "train.epochs=1",
]


def run_compare(*argv: str, runs: list[str] | None = None) -> tuple[int, str, str]:
    """``sslkit-compare ARGV``, its runs in this process (their names appended to ``runs``)."""
    with jobs_in_this_process(runs):
        result = run_main(main, list(argv))
    return result.returncode, result.stdout, result.stderr


@pytest.fixture(scope="module")
def comparison(tmp_path_factory) -> tuple[Path, list[str], int, str]:
    out = tmp_path_factory.mktemp("compare") / "digits"
    runs: list[str] = []
    status, stdout, stderr = run_compare(*ARGV, "--out", str(out), runs=runs)
    return out, runs, status, stdout + stderr


@pytest.mark.slow
def test_each_recipe_trains_the_steps_its_measured_speed_allows_then_is_fine_tuned(comparison):
    out, runs, status, output = comparison
    assert status == 0, output
    assert runs == [
        "calibrate-quickstart",
        "calibrate-quickstart_byol",
        "quickstart-s0",
        "finetune-quickstart-s0",
        "quickstart-s1",
        "finetune-quickstart-s1",
        "quickstart_byol-s0",
        "finetune-quickstart_byol-s0",
        "scratch-s0",
        "scratch-s1",
    ]
    rows = read_csv(out / "results.csv")
    assert [(r["recipe"], r["seed"], r["status"]) for r in rows] == [
        ("quickstart", "0", "ok"),
        ("quickstart", "1", "ok"),
        ("quickstart_byol", "0", "ok"),
        ("scratch", "0", "ok"),
        ("scratch", "1", "ok"),
    ]
    saved = json.loads((out / "results.json").read_text())
    for row in rows[:3]:
        plan = saved["plans"][row["recipe"]]
        calibration_run = out / "runs" / f"calibrate-{row['recipe']}"
        measured = calibration.images_per_s(calibration_run / "metrics.jsonl", 64, calibration.WARMUP_STEPS)[0]
        assert plan["images_per_s"] == pytest.approx(measured)
        assert int(row["steps"]) == plan["steps"] == calibration.budget_steps(0.01, measured, 64)
        config = yaml.safe_load((out / "runs" / f"{row['recipe']}-s{row['seed']}" / "config.yaml").read_text())
        assert (config["train"]["max_steps"], config["run"]["seed"]) == (plan["steps"], int(row["seed"]))
        results = json.loads((out / "runs" / f"{row['recipe']}-s{row['seed']}" / "results.json").read_text())
        assert float(row["knn_top1"]) == pytest.approx(results["results"]["trained"]["knn_top1"], abs=1e-5)
        assert 0 < float(row["finetune_top1"]) <= 1 and float(row["images_per_s"]) > 0
    calibrated = yaml.safe_load((out / "runs" / "calibrate-quickstart" / "config.yaml").read_text())
    assert calibrated["train"]["max_steps"] == calibration.WARMUP_STEPS + 2
    summary = read_csv(out / "summary.csv")
    assert [r["recipe"] for r in summary] == ["quickstart", "quickstart_byol", "scratch"]
    knn = [float(r["knn_top1"]) for r in rows[:2]]
    assert float(summary[0]["knn_top1_mean"]) == pytest.approx(sum(knn) / 2, abs=1e-5)
    assert "comparison at 0.01 min of training" in output


@pytest.mark.slow
def test_the_fine_tune_and_scratch_runs_are_label_efficiencys_roads(comparison):
    out, _, _, _ = comparison
    saved = {r["name"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    runs_dir = out / "runs"
    finetune = trained_run(
        "finetune-quickstart-s1",
        "finetune",
        default_recipe("finetune", "digits").resolve(),
        [*TINY, "train.epochs=1"],
        runs_dir,
        None,
        ("quickstart-s1",),
        (0.1, 1),
        **{"run.init_from": runs_dir / "quickstart-s1"},
    )
    assert saved["finetune-quickstart-s1"]["command"] == shlex.join(finetune.command)
    config = yaml.safe_load((runs_dir / "scratch-s1" / "config.yaml").read_text())
    labels = (config["data"]["label_fraction"], config["data"]["label_seed"])
    assert config["run"]["init_from"] is None and labels == (0.1, 1)


@pytest.mark.slow
def test_a_rerun_skips_what_finished_and_redoes_what_did_not(comparison, tmp_path):
    out, _, _, _ = comparison
    copy = tmp_path / "again"
    shutil.copytree(out, copy)
    (copy / "runs" / "quickstart_byol-s0" / "results.json").unlink()
    runs: list[str] = []
    status, stdout, stderr = run_compare(*ARGV, "--out", str(copy), runs=runs)
    assert status == 0, stdout + stderr
    assert runs == ["quickstart_byol-s0"]  # the calibrations are read back: the same budget, the same steps
    assert stdout.count("done, skipped") == 9


@pytest.mark.slow
def test_another_budget_into_the_same_out_is_refused(comparison):
    out, _, _, _ = comparison
    argv = [a if a != "0.01" else "0.02" for a in ARGV]
    status, _, stderr = run_compare(*argv, "--out", str(out))
    assert status == 2
    # The budget's steps (and, past an epoch boundary, its epochs) differ from the saved run's.
    assert re.search(r"was run with train\.(max_steps|epochs)=", stderr) and "another --out" in stderr


def test_a_fixmatch_recipe_is_sized_by_both_of_its_streams():
    """A FixMatch epoch is a pass over the unlabelled images, mu x B of them a step, and each step loads
    B (1 + mu) images: the budget divides images/s by those, as the run's own log counts them."""
    fixmatch, simclr = compare.build_entries(["quickstart_fixmatch", "quickstart"], TINY[:4], 1, [])
    batch, mu = 16, 7  # recipes/quickstart_fixmatch.yaml
    assert (fixmatch.images_per_step, fixmatch.steps_per_epoch) == (batch * (1 + mu), 1437 // (batch * mu))
    assert (simclr.images_per_step, simclr.steps_per_epoch) == (256, 1437 // 256)  # digits' 1437 training images
    accumulated = compare.build_entries(["quickstart"], [*TINY, "train.grad_accum_steps=4"], 1, [])[0]
    assert (accumulated.images_per_step, accumulated.steps_per_epoch) == (256, 6)  # 22 batches: 5 windows, 1 short


def test_images_per_s_counts_only_the_windows_after_the_warm_up(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 5, "images_per_s": 10.0},
        {"step": 10, "images_per_s": 100.0},
        {"step": 10, "epoch": 1, "knn_top1": 0.5},
        {"step": 15, "images_per_s": 200.0},
        {"step": 17, "images_per_s": 100.0},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    # After step 5: 5 x 4 images at 100/s, 5 x 4 at 200/s, 2 x 4 at 100/s: 48 images in 0.38 s.
    speed, seconds = calibration.images_per_s(path, 4, after_step=5)
    assert seconds == pytest.approx(0.38)
    assert speed == pytest.approx(48 / 0.38)
    assert calibration.images_per_s(tmp_path / "missing.jsonl", 4) is None
    assert calibration.budget_steps(10, 600.0, 256) == 1406
    assert calibration.budget_steps(0.001, 1.0, 256) == 1


def test_a_figure_measured_before_a_later_step_failed_is_in_the_summary():
    failed = {"recipe": "r", "status": "failed", "metrics": {"knn_top1": 0.9}, **dict.fromkeys(compare.SPEEDS)}
    ok = {
        "recipe": "r",
        "status": "ok",
        "metrics": {"knn_top1": 0.8, "finetune_top1": 0.7},
        **dict.fromkeys(compare.SPEEDS),
    }
    (line,) = compare.summarize([failed, ok])
    assert line["n_ok"] == 1 and line["n_failed"] == 1
    assert line["knn_top1_mean"] == pytest.approx(0.85) and line["finetune_top1_mean"] == pytest.approx(0.7)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["quickstart", "--minutes", "0"], ["--minutes", "positive"]),
        (["quickstart", "--minutes", "1", "--fraction", "2"], ["--fraction", "(0, 1]"]),
        (["quickstart", "--minutes", "1", "--seeds-for", "simclr=2"], ["simclr is not one of the recipes"]),
        (["quickstart", "--minutes", "1", "train.epochs=3"], ["compare sets train.epochs", "--minutes"]),
        (["quickstart", "recipes/quickstart.yaml", "--minutes", "1"], ["same name"]),
        (["quickstart", "fashion_mnist_simclr", "--minutes", "1"], ["data.name=fashion_mnist", "same images"]),
        (["quickstart", "--minutes", "1", "--finetune-override", "model.width=8"], ["model.width=8", "model.width=4"]),
        (["quickstart", "--minutes", "1", "--scratch-recipe", "fashion_mnist_finetune"], ["--scratch-recipe"]),
        (["--minutes", "1", "train.threads=1"], ["no recipe given"]),
        (["quickstart", "--minutes", "1", "--fraction", "0.01"], ["leaves 10 labelled images", "batch_size=10"]),
    ],
)
def test_mistakes_fail_in_one_line_before_anything_runs(tmp_path, argv, words):
    runs: list[str] = []
    status, _, stderr = run_compare(*argv, *TINY, "--out", str(tmp_path / "out"), runs=runs)
    assert status == 2 and runs == []
    assert len(stderr.strip().splitlines()) == 1, stderr
    for word in words:
        assert word in stderr, stderr
