"""tools/bench/run.py runs a benchmark in a subprocess and gathers its headline figures; the race's
bookkeeping reads a real ``metrics.jsonl`` layout and builds its summary.

The runner test runs the training benchmark for real (``--quick``: Fashion-MNIST, a width-8
ResNet-18, 4 steps a phase); the race itself takes minutes even at its smallest, so its summary
builder and metrics reader are tested on their own.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "tools" / "bench"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


@pytest.mark.slow
def test_runner_quick_train_writes_report_and_summary(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(BENCH / "run.py"), "--quick", "--only", "train", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "headline figures" in proc.stdout

    report = json.loads((tmp_path / "train.json").read_text())
    assert report["quick"] is True and report["steps"] == 4
    assert report["schedule"] == "interleaved"  # the recipe's loader has no workers
    s = report["summary"]
    assert _positive(s["full"]["images_per_s"]) and _positive(s["floor"]["images_per_s"])
    assert set(s["full"]["median_s"]) == {"data_wait", "augment", "compute"}
    wait = s["data_wait"]
    assert 0 <= wait["median_s"] <= wait["max_s"] and 0 <= wait["share"] < 1
    assert 0 <= s["data_and_augment_share"] < 1
    # the per-step records add up: each full step is its data wait + augmentation + compute
    for step in report["per_step"]["full"]:
        assert math.isclose(step["data_wait"] + step["augment"] + step["compute"], step["total"], rel_tol=1e-6)
    assert len(report["per_step"]["full"]) == len(report["per_step"]["floor"]) == 4

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["quick"] is True and summary["failed"] == []
    assert list(summary["benchmarks"]) == ["train"] and summary["benchmarks"]["train"]["status"] == "ok"
    rows = {r["figure"]: r for r in summary["headlines"]}
    share = rows["data-wait share of step time"]
    assert share["benchmark"] == "train" and share["value"] == wait["share"]
    assert share["passed"] == (wait["share"] < 0.05)
    assert rows["data + augmentation share of the step"]["value"] == s["data_and_augment_share_in_step"]


def test_runner_records_a_failed_benchmark_and_goes_on(tmp_path):
    run = load("run")
    failing = [
        sys.executable,
        "-c",
        "import sys; print('partial output'); print('boom: no data', file=sys.stderr); sys.exit(3)",
    ]
    record = run.run_benchmark("knn", failing, run.Console(file=open(tmp_path / "log.txt", "w")), timeout=60)
    assert record["status"] == "error" and record["returncode"] == 3
    assert "exit code 3" in record["error"] and "boom: no data" in record["error"]
    rows = run.headlines_for("knn", {**record, "json": str(tmp_path / "knn.json")}, tmp_path / "knn.json")
    assert len(rows) == 1 and rows[0].passed is False and "boom" in rows[0].note

    slow = [sys.executable, "-c", "import time; time.sleep(60)"]
    record = run.run_benchmark("knn", slow, run.Console(file=open(tmp_path / "log2.txt", "w")), timeout=1)
    assert record["status"] == "error" and record["error"].startswith("timed out")


def test_headlines_read_each_benchmark_layout(tmp_path):
    run = load("run")
    losses = {
        "batch_losses": [
            {
                "loss": "ntxent",
                "peer": "lightly NTXentLoss",
                "available": True,
                "sslkit_over_matmul3": 1.4,
                "sslkit_over_peer": 0.5,
            },
            {"loss": "dcl", "peer": "lightly DCLLoss", "available": False, "note": "not available (ImportError)"},
        ],
        "heads": [
            {
                "loss": "arcface",
                "peer": "pml ArcFaceLoss",
                "available": True,
                "sslkit_over_matmul3": 1.2,
                "sslkit_over_peer": 0.9,
            }
        ],
    }
    rows = {r.figure: r for r in run.losses_headlines(losses)}
    assert rows["ntxent fwd+bwd / 3 matmuls"].passed is True
    assert rows["arcface fwd+bwd / 3 matmuls"].passed is False  # 1.2 > 1.15
    assert rows["ntxent: sslkit / lightly NTXentLoss"].passed is True
    assert rows["dcl fwd+bwd / 3 matmuls"].passed is None and "not available" in rows["dcl fwd+bwd / 3 matmuls"].note
    assert rows["supcon fwd+bwd / 3 matmuls"].value is None  # absent from the report: shown, not dropped

    augment = {
        "pipelines": {
            "torchvision-per-image": {"sslkit_speedup_wall": 12.0},
            "kornia-sequential": {"sslkit_speedup_wall": 0.8},
        }
    }
    assert [r.passed for r in run.augment_headlines(augment)] == [True, False]
    assert [r.passed for r in run.knn_headlines({"sklearn_over_sslkit": 3.0})] == [True]

    # A report that is not the layout expected is a failed row, not a crash of the runner.
    (tmp_path / "train.json").write_text("[1, 2]")
    rows = run.headlines_for("train", {"status": "ok"}, tmp_path / "train.json")
    assert rows[0].figure == "report unreadable" and rows[0].passed is False


def test_race_reads_per_step_metrics_across_epochs(tmp_path):
    race = load("race")
    # As sslkit.loop writes metrics.jsonl with log_every_steps=1: 3 batches an epoch, 2 epochs,
    # then the final evaluation.
    records, batch = [], 32
    for epoch in range(2):
        for k in range(3):
            step = epoch * 3 + k + 1
            seconds = 0.5 if k == 0 else 0.1  # the first step of an epoch also starts the epoch's iterator
            records.append(
                {
                    "step": step,
                    "epoch": epoch,
                    "loss": 4.0,
                    "lr": 1e-3,
                    "images_per_s": batch / seconds,
                    "data_wait_share": 0.2 if k == 0 else 0.01,
                }
            )
    records.append({"step": 6, "epoch": 2, "final_knn_top1": 0.5})
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))

    figures = race.read_sslkit_metrics(path, batch, batches_per_epoch=3)
    assert figures["steps"] == 6
    assert math.isclose(figures["train_s"], 2 * (0.5 + 0.1 + 0.1))
    assert math.isclose(figures["images_per_s"], 6 * batch / 1.4)
    assert math.isclose(figures["data_wait_share"], 2 * (0.5 * 0.2 + 2 * 0.1 * 0.01) / 1.4)
    assert math.isclose(figures["data_wait_max_s"], 0.1) and math.isclose(figures["data_wait_median_s"], 0.001)


def test_race_summary_says_where_sslkit_loses():
    race = load("race")
    sslkit = {"images_per_s": 300.0, "knn_top1": 0.80, "data_wait_share": 0.01}
    lightly = {"images_per_s": 600.0, "knn_top1": 0.82, "data_wait_share": 0.4, "num_workers": 2}
    s = race.summarize(sslkit, lightly)
    assert s["sslkit_over_lightly_images_per_s"] == pytest.approx(0.5)
    assert s["knn_top1_sslkit_minus_lightly"] == pytest.approx(-0.02)
    assert not s["sslkit_faster"] and not s["sslkit_as_accurate"]
    assert any("2.00x slower" in f for f in s["findings"]) and any("2.00 points below" in f for f in s["findings"])
    assert any("waits on its loader 40%" in f for f in s["findings"])
    assert s["knn_top1_difference_standard_error"] is None

    # With the test-set size the gap is set against its noise: 2 points on 100 images is noise, on 100k it is not.
    noisy = race.summarize(sslkit, lightly, test_images=100)
    assert noisy["knn_top1_difference_standard_error"] == pytest.approx(math.sqrt((0.8 * 0.2 + 0.82 * 0.18) / 100))
    assert any("within the" in f for f in noisy["findings"])
    assert not any("within the" in f for f in race.summarize(sslkit, lightly, test_images=100_000)["findings"])

    s = race.summarize({**sslkit, "images_per_s": 900.0, "knn_top1": 0.83}, lightly)
    assert s["sslkit_faster"] and s["sslkit_as_accurate"]
    assert not any("slower" in f or "below" in f for f in s["findings"])


def test_race_default_recipe_is_raceable():
    """The race's default (the Fashion-MNIST recipe, which has blur and solarize) must pass its own check."""
    from sslkit.config import load_config

    race = load("race")
    recipe, implied = race.default_recipe()
    cfg = load_config(recipe, implied + race.race_overrides(False, 4, 1, []))
    race.check_raceable(cfg)
    assert cfg.augment.blur_p == 0 and cfg.augment.solarize_p == 0


def test_train_bench_builds_with_the_trainers_builders_and_times_npid():
    """The training benchmark builds its pieces with sslkit.loop's own builders (so a recipe's
    global BatchNorm reaches it), and passes sample indices to a method that needs them."""
    bench = load("train")
    cfg, *_ = bench.resolve_config(
        None,
        ["method.name=nce", "loss.name=nce", "model.sync_batchnorm=true", "train.batch_size=16", "model.width=4"],
        quick=True,
    )
    pieces = bench.build_pieces(cfg, total_steps=4)
    assert any(type(m).__name__ == "GlobalBatchNorm" for m in pieces.step.method.modules())
    full, floor, order = bench.measure(pieces, steps=1, warmup=1, num_workers=0)
    assert order == "interleaved" and _positive(full[0]["loss"]) and _positive(floor[0]["loss"])
