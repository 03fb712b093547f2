"""sslkit-ablate: a real tiny sweep on digits (every point a ``python -m sslkit.cli.pretrain`` subprocess),
resume after an unfinished point, a point that diverges, and the mistakes that must fail up front.

The sweep is driven through ``sslkit.cli.ablate.main(argv)`` in this process (its points are real
subprocesses); one test runs the command itself to check the one-line error and exit status.
Points are tiny (a width-4 ResNet-18 on 8x8 crops, 2 steps), so each costs about one Python
start-up with torch; the file runs 5 of them. Aggregation and plotting are checked on
hand-written records, where the expected means and standard deviations are known.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from command_utils import block_matplotlib, read_csv, run_main

from sslkit.cli.ablate import main
from sslkit.config import load_config
from sslkit.errors import UserError
from sslkit.experiments import ablate

ROOT = Path(__file__).resolve().parents[1]


QUICKSTART = str(ROOT / "recipes" / "quickstart.yaml")
TINY = [
    "model.width=4",
    "model.projector_hidden=32",
    "model.projector_out=16",
    "augment.image_size=8",
    "train.batch_size=64",
    "train.max_steps=2",
    "train.log_every_steps=1",
    "train.threads=1",
    "eval.linear_epochs=2",
    "eval.compare_random_init=false",
    "optim.warmup_epochs=0",
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_ablate(*argv: str, recipe: str = QUICKSTART) -> tuple[int, str, str]:
    """``sslkit-ablate RECIPE TINY ARGV`` in this process with one-thread points; returns (status, stdout, stderr)."""
    result = run_main(main, [recipe, *TINY, *argv], OMP_NUM_THREADS="1")
    return result.returncode, result.stdout, result.stderr


# --------------------------------------------------------------------------- a real sweep


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[Path, int, str]:
    out = tmp_path_factory.mktemp("ablate") / "temperature"
    status, stdout, stderr = run_ablate("--sweep", "loss.temperature=0.1,0.5", "--out", str(out))
    return out, status, stdout + stderr


@pytest.mark.slow
def test_sweep_runs_every_point_and_writes_tables_and_plots(sweep):
    out, status, output = sweep
    assert status == 0, output
    names = ["loss.temperature=0.1_seed=0", "loss.temperature=0.5_seed=0"]
    for name in names:
        run = out / "runs" / name
        # each point is a normal run directory, made by the user's own command with the swept value
        assert (run / "results.json").is_file() and (run / "backbone.safetensors").is_file()
        assert f"temperature: {name.split('=')[1].split('_')[0]}" in (run / "config.yaml").read_text()
    rows = read_csv(out / "results.csv")
    assert [r["name"] for r in rows] == names
    assert [r["loss.temperature"] for r in rows] == ["0.1", "0.5"]
    for row, name in zip(rows, names):
        trained = json.loads((out / "runs" / name / "results.json").read_text())["results"]["trained"]
        assert row["status"] == "ok" and row["seed"] == "0" and float(row["wall_s"]) > 0 and float(row["cpu_s"]) > 0
        assert float(row["knn_top1"]) == pytest.approx(trained["knn_top1"], rel=1e-5)
        assert float(row["linear_top1"]) == pytest.approx(trained["linear_top1"], rel=1e-5)
    points = json.loads((out / "results.json").read_text())["points"]
    assert [p["values"] for p in points] == [{"loss.temperature": 0.1}, {"loss.temperature": 0.5}]
    summary = read_csv(out / "summary.csv")
    assert [(r["loss.temperature"], r["n_ok"], r["n_failed"]) for r in summary] == [
        ("0.1", "1", "0"),
        ("0.5", "1", "0"),
    ]
    assert summary[0]["knn_top1_mean"] == rows[0]["knn_top1"] and summary[0]["knn_top1_std"] == ""  # one seed: no std
    for metric in ("knn_top1", "linear_top1"):
        assert (out / f"{metric}.png").read_bytes().startswith(PNG_MAGIC)
    assert "mean ± std" in output and "[2/2] loss.temperature=0.5_seed=0: ok" in output


@pytest.mark.slow
def test_two_points_at_once_give_the_tables_of_one_at_a_time(sweep, tmp_path):
    """Every point is seeded by itself: run side by side (``--jobs 2``), its numbers are those it has alone."""
    out = tmp_path / "two-at-once"
    status, stdout, stderr = run_ablate("--sweep", "loss.temperature=0.1,0.5", "--out", str(out), "--jobs", "2")
    assert status == 0, stdout + stderr

    def without_times(rows: list[dict]) -> list[dict]:
        return [{key: value for key, value in row.items() if key not in ("wall_s", "cpu_s")} for row in rows]

    for table in ("results.csv", "summary.csv"):
        assert without_times(read_csv(out / table)) == without_times(read_csv(sweep[0] / table)), table

    def records(folder: Path) -> list[dict]:
        text = (folder / "results.json").read_text().replace(str(folder), "OUT")  # the paths into the output
        return without_times(json.loads(text)["points"])

    assert records(out) == records(sweep[0])


@pytest.mark.slow
def test_rerun_skips_finished_points_and_redoes_an_unfinished_one(sweep, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(sweep[0], out)
    done, unfinished = out / "runs" / "loss.temperature=0.1_seed=0", out / "runs" / "loss.temperature=0.5_seed=0"
    (unfinished / "results.json").unlink()  # as if the sweep was stopped while this point ran
    done_mtime, unfinished_mtime = (
        (done / "metrics.jsonl").stat().st_mtime_ns,
        (unfinished / "metrics.jsonl").stat().st_mtime_ns,
    )
    status, stdout, stderr = run_ablate("--sweep", "loss.temperature=0.1,0.5", "--out", str(out))
    assert status == 0, stdout + stderr
    assert stdout.count("done, skipped") == 1 and "loss.temperature=0.1_seed=0: done, skipped" in stdout
    assert "loss.temperature=0.5_seed=0: ok" in stdout
    assert (done / "metrics.jsonl").stat().st_mtime_ns == done_mtime
    assert (unfinished / "metrics.jsonl").stat().st_mtime_ns > unfinished_mtime and (
        unfinished / "results.json"
    ).is_file()
    rows = read_csv(out / "results.csv")
    assert [(r["status"], r["skipped"]) for r in rows] == [("ok", "True"), ("ok", "False")]
    assert float(rows[0]["wall_s"]) > 0  # the skipped point keeps the wall time of the run that made it


@pytest.mark.slow
def test_rerun_without_matplotlib_writes_tables_and_says_how_to_get_plots(sweep, tmp_path, monkeypatch):
    out = tmp_path / "copy"
    shutil.copytree(sweep[0], out)
    for png in out.glob("*.png"):
        png.unlink()
    block_matplotlib(monkeypatch)
    status, stdout, stderr = run_ablate("--sweep", "loss.temperature=0.1,0.5", "--out", str(out))
    assert status == 0, stdout + stderr
    assert stdout.count("done, skipped") == 2
    assert not list(out.glob("*.png"))
    assert 'pip install "sslkit[plot]"' in stdout
    assert len(read_csv(out / "summary.csv")) == 2


@pytest.mark.slow
def test_rerun_with_other_settings_into_the_same_out_is_refused(sweep):
    out = sweep[0]
    status, stdout, stderr = run_ablate(
        "--sweep", "loss.temperature=0.1,0.5", "--out", str(out), "eval.linear_epochs=3"
    )
    assert status == 2
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "eval.linear_epochs=2" in lines[0] and "eval.linear_epochs=3" in lines[0], stderr
    assert "done, skipped" not in stdout


@pytest.mark.slow
def test_a_diverging_point_is_recorded_and_the_next_one_still_runs(tmp_path, monkeypatch):
    out = tmp_path / "lr"
    # lr 1e30 gives a NaN loss at the first step (sslkit stops with one line); it comes first in the grid.
    # The recipe by its bundled name, from a directory without recipes/: every point finds it too.
    monkeypatch.chdir(tmp_path)
    status, stdout, stderr = run_ablate("--sweep", "optim.lr=1e30,0.002", "--out", str(out), recipe="quickstart")
    assert status == 1, stdout + stderr
    rows = read_csv(out / "results.csv")
    assert [(r["optim.lr"], r["status"]) for r in rows] == [("1e30", "failed"), ("0.002", "ok")]
    assert rows[0]["error"].startswith("loss became nan") and "optim.lr" in rows[0]["error"]
    assert rows[0]["knn_top1"] == "" and 0 <= float(rows[1]["knn_top1"]) <= 1
    assert (out / "runs" / "optim.lr=0.002_seed=0" / "results.json").is_file()
    assert "loss became nan" in (out / "logs" / "optim.lr=1e30_seed=0.err").read_text()
    summary = read_csv(out / "summary.csv")
    assert [(r["n_ok"], r["n_failed"], r["knn_top1_mean"]) for r in summary][0] == ("0", "1", "")
    assert "1 of 2 points failed" in stdout


# --------------------------------------------------------------------------- mistakes, up front


def test_bad_sweep_syntax_gives_one_line_from_the_command(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sslkit.cli.ablate",
            QUICKSTART,
            "--sweep",
            "loss.temperature:0.1,0.2",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "loss.temperature:0.1,0.2" in lines[0] and "key=V1,V2" in lines[0], result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--sweep", "loss.temprature=0.1,0.2"], ["loss.temprature", "temperature"]),  # a typo in a key
        (["--sweep", "train.epochs=2,three"], ["train.epochs=three", "must be int"]),  # one bad value among good ones
        (["--sweep", "loss.temperature=0.1,0"], ["loss.temperature=0", "> 0"]),
        (["--sweep", "loss.temperature=0.1", "--sweep", "loss.temperature=0.2"], ["swept twice"]),
        (["--sweep", "run.seed=1,2"], ["--seeds"]),
        (["--sweep", "loss.temperature=0.1,0.1"], ["twice"]),
        (["--sweep", "loss.temperature=0.1,0.2", "run.name=mine"], ["run.name", "--out"]),
        ([], ["nothing to sweep"]),
        (["--sweep", "loss.temperature=0.1", "--seeds", "0"], ["--seeds"]),
    ],
)
def test_mistakes_fail_before_anything_runs(tmp_path, argv, words):
    status, stdout, stderr = run_ablate(*argv, "--out", str(tmp_path / "out"))
    assert status == 2
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_a_point_whose_loss_the_method_cannot_train_fails_before_the_first_point_runs(tmp_path):
    status, stdout, stderr = run_ablate("--sweep", "loss.name=ntxent,arcface", "--out", str(tmp_path / "out"))
    assert status == 2
    # the loss override's own note (which recipe keys arcface drops) may come first; then one error line
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("note:")]
    assert len(lines) == 1, stderr
    assert "method 'simclr' needs a two-view loss" in lines[0] and "method.name=supervised" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- the grid


@pytest.mark.parametrize(
    "text, key, values",
    [
        ("loss.temperature=0.05,0.1,0.2", "loss.temperature", ["0.05", "0.1", "0.2"]),
        ("augment.crop_scale=[0.08,1.0],[0.2, 1.0]", "augment.crop_scale", ["[0.08,1.0]", "[0.2, 1.0]"]),
        ("data.name=digits", "data.name", ["digits"]),
    ],
)
def test_parse_sweep(text, key, values):
    assert ablate.parse_sweep(text) == (key, values)


@pytest.mark.parametrize(
    "text", ["loss.temperature", "=0.1,0.2", "loss.temperature=", "loss.temperature=0.1,,0.2", "temperature=0.1"]
)
def test_parse_sweep_rejects(text):
    with pytest.raises(UserError, match="section.key=V1,V2"):
        ablate.parse_sweep(text)


def test_grid_is_the_product_with_seeds_innermost_and_paths_made_safe():
    points = ablate.build_grid([("loss.temperature", ["0.1", "0.2"]), ("data.root", ["/a/b"])], seeds=[3, 4])
    assert [p.name for p in points] == [
        "loss.temperature=0.1_data.root=-a-b_seed=3",
        "loss.temperature=0.1_data.root=-a-b_seed=4",
        "loss.temperature=0.2_data.root=-a-b_seed=3",
        "loss.temperature=0.2_data.root=-a-b_seed=4",
    ]
    assert points[1].overrides() == ["loss.temperature=0.1", "data.root=/a/b", "run.seed=4"]
    with pytest.raises(UserError, match="same run directory name"):
        ablate.build_grid([("data.root", ["/a", "-a"])], seeds=[0])


def test_variants_are_named_settings_crossed_with_the_sweeps(tmp_path):
    path = tmp_path / "variants.yaml"
    path.write_text(
        "triplet-hard: {loss.name: triplet, loss.mining: hard}\n"
        "crops: {augment.crop_scale: [0.2, 1.0], method.name: supcon}\n"
    )
    variants = ablate.read_variants(path, swept=["optim.lr"])
    assert variants == [
        ("triplet-hard", ("loss.name=triplet", "loss.mining=hard")),
        ("crops", ("augment.crop_scale=[0.2, 1.0]", "method.name=supcon")),
    ]
    points = ablate.build_grid([("optim.lr", ["0.1", "0.2"])], seeds=[0], variants=variants)
    assert [p.name for p in points] == [
        "variant=triplet-hard_optim.lr=0.1_seed=0",
        "variant=triplet-hard_optim.lr=0.2_seed=0",
        "variant=crops_optim.lr=0.1_seed=0",
        "variant=crops_optim.lr=0.2_seed=0",
    ]
    assert points[2].overrides() == [
        "augment.crop_scale=[0.2, 1.0]",
        "method.name=supcon",
        "optim.lr=0.1",
        "run.seed=0",
    ]
    assert dict(points[2].values) == {"variant": "crops", "optim.lr": "0.1"}


@pytest.mark.parametrize(
    "text, message",
    [
        ("- a\n- b\n", "must map variant names to their settings"),
        ("a: 3\n", "variant 'a' must map dotted keys to values"),
        ("a: {temperature: 0.1}\n", "section.key=V1,V2"),
        ("a: {run.name: x}\n", "ablate sets run.name"),
        ("a: {optim.lr: 0.1}\n", "variant 'a' sets optim.lr, which --sweep optim.lr also changes"),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_variants_file_mistakes_are_one_line(tmp_path, text, message):
    path = tmp_path / "variants.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=message) as info:
        ablate.read_variants(path, swept=["optim.lr"])
    assert "\n" not in str(info.value)
    with pytest.raises(UserError, match="cannot read it"):
        ablate.read_variants(tmp_path / "missing.yaml", swept=[])


def test_the_bundled_variants_all_load_on_their_recipe():
    """Each variant of the metric-learning comparison is a valid config of the recipe it names."""
    path = Path(__file__).parents[1] / "recipes" / "variants" / "fashion_mnist_metric_losses.yaml"
    for name, settings in ablate.read_variants(path, swept=[]):
        load_config(Path(__file__).parents[1] / "recipes" / "fashion_mnist_supcon.yaml", list(settings))


def test_a_point_is_the_users_command_behind_the_launcher(tmp_path):
    point = ablate.Point((("loss.temperature", "0.2"),), seed=1)
    job = ablate.point_job(point, Path("r.yaml"), ["train.epochs=3"], tmp_path, None)
    assert job.command()[:4] == [sys.executable, "-m", "sslkit.cli.pretrain", "r.yaml"]
    assert job.command()[4:] == [
        "train.epochs=3",
        "loss.temperature=0.2",
        "run.seed=1",
        f"run.output_dir={tmp_path / 'runs'}",
        f"run.name={point.name}",
        "run.resume=auto",
    ]
    assert job.result == tmp_path / "runs" / point.name / "results.json"
    assert job.fields["values"] == {"loss.temperature": 0.2} and job.fields["seed"] == 1
    launched = ablate.point_job(
        point, Path("r.yaml"), ["train.epochs=3"], tmp_path, "accelerate launch --cpu --num_processes 2"
    )
    assert launched.command() == ["accelerate", "launch", "--cpu", "--num_processes", "2", *job.command()[1:]]


# --------------------------------------------------------------------------- aggregation and plots


def record(temperature: str, lr: str, seed: int, knn: float | None, linear: float | None = None) -> dict:
    failed = knn is None
    metrics = {} if failed else {"knn_top1": knn, "linear_top1": linear if linear is not None else knn / 2}
    return {
        "name": f"t{temperature}-lr{lr}-s{seed}",
        "values": {},
        "values_text": {"loss.temperature": temperature, "optim.lr": lr},
        "seed": seed,
        "status": "failed" if failed else "ok",
        "skipped": False,
        "error": "boom" if failed else None,
        "wall_s": 1.0,
        "cpu_s": 2.0,
        "metrics": metrics,
        "run_dir": "x",
    }


RECORDS = [
    record("0.02", "0.1", 0, 0.60),
    record("0.02", "0.1", 1, 0.70),
    record("0.02", "0.1", 2, 0.80),
    record("0.5", "0.1", 0, 0.50),
    record("0.5", "0.1", 1, None),
    record("0.5", "0.1", 2, 0.52),
    record("0.02", "1.0", 0, 0.30),
    record("0.02", "1.0", 1, 0.32),
    record("0.02", "1.0", 2, None),
    record("0.5", "1.0", 0, None),
    record("0.5", "1.0", 1, None),
    record("0.5", "1.0", 2, None),
]
KEYS = ["loss.temperature", "optim.lr"]


def test_summary_is_mean_and_sample_std_over_the_seeds_that_succeeded():
    rows = {tuple(r["values_text"].values()): r for r in ablate.summarize(RECORDS, KEYS)}
    first = rows[("0.02", "0.1")]
    assert (first["n_ok"], first["n_failed"]) == (3, 0)
    assert first["knn_top1_mean"] == pytest.approx(0.70) and first["knn_top1_std"] == pytest.approx(0.10)  # n - 1
    assert first["linear_top1_mean"] == pytest.approx(0.35) and first["values"] == {
        "loss.temperature": 0.02,
        "optim.lr": 0.1,
    }
    partly = rows[("0.5", "0.1")]
    assert (partly["n_ok"], partly["n_failed"]) == (2, 1)
    assert partly["knn_top1_mean"] == pytest.approx(0.51) and partly["knn_top1_std"] == pytest.approx(
        statistics.stdev([0.50, 0.52])
    )
    assert rows[("0.02", "1.0")]["knn_top1_std"] == pytest.approx(statistics.stdev([0.30, 0.32]))
    none = rows[("0.5", "1.0")]
    assert (none["n_ok"], none["knn_top1_mean"], none["knn_top1_std"]) == (0, None, None)


def test_tables_and_plots_from_records(tmp_path):
    summary = ablate.write_tables(tmp_path, RECORDS, KEYS, {"recipe": "r.yaml"})
    rows = read_csv(tmp_path / "summary.csv")
    assert len(rows) == 4 and float(rows[0]["knn_top1_mean"]) == pytest.approx(0.70) and rows[3]["knn_top1_mean"] == ""
    assert len(read_csv(tmp_path / "results.csv")) == 12
    assert json.loads((tmp_path / "results.json").read_text())["recipe"] == "r.yaml"

    figure = ablate.plot_metric(summary, KEYS, "knn_top1", tmp_path / "knn_top1.png")
    assert (tmp_path / "knn_top1.png").read_bytes().startswith(PNG_MAGIC)
    axes = figure.axes[0]
    assert axes.get_xscale() == "log"  # 0.02 to 0.5: positive, spanning 25x
    assert [label.get_text() for label in axes.get_legend().get_texts()] == ["optim.lr=0.1", "optim.lr=1.0"]
    data_line, _, _ = axes.containers[0]
    assert list(data_line.get_xdata()) == [0.02, 0.5] and list(data_line.get_ydata()) == pytest.approx([0.70, 0.51])

    decade = [record("0.05", "0.1", 0, 0.5), record("0.5", "0.1", 0, 0.6)]  # the usual temperature sweep: exactly 10x
    figure = ablate.plot_metric(
        ablate.summarize(decade, ["loss.temperature"]), ["loss.temperature"], "knn_top1", tmp_path / "d.png"
    )
    assert figure.axes[0].get_xscale() == "log"
    narrow = [record("0.1", "0.1", 0, 0.5), record("0.2", "0.1", 0, 0.6)]
    figure = ablate.plot_metric(
        ablate.summarize(narrow, ["loss.temperature"]), ["loss.temperature"], "knn_top1", tmp_path / "n.png"
    )
    assert figure.axes[0].get_xscale() == "linear" and figure.axes[0].get_legend() is None


def test_non_numeric_values_are_categories(tmp_path):
    records = [record("0.1", "0.1", 0, 0.5), record("0.1", "0.1", 1, 0.7)]
    for r, name in zip(records, ("digits", "fashion_mnist")):
        r["values_text"] = {"data.name": name}
    figure = ablate.plot_metric(
        ablate.summarize(records, ["data.name"]), ["data.name"], "knn_top1", tmp_path / "c.png"
    )
    axes = figure.axes[0]
    assert [t.get_text() for t in axes.get_xticklabels()] == ["digits", "fashion_mnist"]
    assert list(axes.containers[0][0].get_xdata()) == [0, 1]


def test_plots_are_skipped_without_matplotlib(tmp_path, monkeypatch):
    block_matplotlib(monkeypatch)
    summary = ablate.write_tables(tmp_path, RECORDS, KEYS, {})
    assert ablate.plot_metric(summary, KEYS, "knn_top1", tmp_path / "knn_top1.png") is None
    assert not (tmp_path / "knn_top1.png").exists() and (tmp_path / "summary.csv").is_file()
    assert not math.isnan(float(read_csv(tmp_path / "summary.csv")[0]["knn_top1_mean"]))


def test_parse_value_reads_numbers_as_the_config_does():
    assert ablate.parse_value("1e-3") == 0.001 and ablate.parse_value("0.1") == 0.1 and ablate.parse_value("64") == 64
    assert ablate.parse_value("digits") == "digits" and ablate.parse_value("[0.08,1.0]") == [0.08, 1.0]
    assert os.sep not in ablate.Point((("data.root", "/x/y"),), 0).name
