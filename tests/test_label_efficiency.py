"""sslkit-label-efficiency: the runs it plans, the mistakes that must fail up front, the aggregation
(mean and std over seeds, best of the two scratch runs, tables and plot), and one real tiny comparison
on digits with the bundled quick-start recipes, rerun to check it resumes.

The comparison is driven through ``sslkit.cli.label_efficiency.main(argv)`` in this process, and so is
every run it plans: each ``python -m MODULE ARGS`` command through ``MODULE.main(ARGS)``, its output to
the logs the runner writes (tests/command_utils.py: an interpreter start with torch costs more than a
tiny run; the runner's own processes are tested in test_runner.py and test_ablate.py). One test runs the
command itself to check the one-line error and the exit status.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from command_utils import block_matplotlib, jobs_in_this_process, read_csv, run_main

from sslkit.cli.label_efficiency import main
from sslkit.config import find_recipe
from sslkit.errors import UserError
from sslkit.experiments import label_budgets as lb
from sslkit.experiments import label_efficiency as le
from sslkit.experiments import label_efficiency_tables as lt
from sslkit.experiments import roads as registry
from sslkit.experiments.label_budgets import Budget, LabelPool
from sslkit.experiments.runs import Run, fraction_text

ROOT = Path(__file__).resolve().parents[1]


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Every run: a width-8 ResNet-18 on 8x8 crops of the digits, one thread, a one-epoch linear probe.
TINY = [
    "model.width=8",
    "model.projector_hidden=32",
    "model.projector_out=16",
    "augment.image_size=8",
    "train.epochs=2",
    "train.log_every_steps=1",
    "train.threads=1",
    "eval.linear_epochs=1",
    "eval.compare_random_init=false",
    "eval.compare_raw_pixels=false",
    "optim.warmup_epochs=0",
]
# The fine-tune, distill and scratch runs: one epoch (the long scratch run two), bigger batches (fewer
# steps), no linear probe of their backbone (their figure is their own classifier's).
TINY_FINETUNE = ["train.epochs=1", "train.batch_size=128", "eval.linear_epochs=0"]
COMPARISON = [
    *TINY,
    "--fractions",
    "0.1,1",
    "--seeds",
    "1",
    "--scratch-factor",
    "2",
    "--pretrain-override",
    "train.epochs=1",
    *(arg for override in TINY_FINETUNE for arg in ("--finetune-override", override)),
]


def run_tool(*argv: str, recipe: str = "quickstart") -> tuple[int, str, str]:
    """``sslkit-label-efficiency RECIPE ARGV``, its runs in this process; returns (status, stdout, stderr)."""
    with jobs_in_this_process():
        result = run_main(main, [recipe, *argv])
    return result.returncode, result.stdout, result.stderr


# --------------------------------------------------------------------------- a real tiny comparison


@pytest.fixture(scope="module")
def comparison(tmp_path_factory) -> tuple[Path, int, str]:
    out = tmp_path_factory.mktemp("label_efficiency") / "digits"
    status, stdout, stderr = run_tool(*COMPARISON, "--out", str(out))
    return out, status, stdout + stderr


RUNS = [
    "pretrain",
    "frozen-f0.1-s0",
    "finetune-f0.1-s0",
    "distill-f0.1-s0",
    "scratch-f0.1-s0",
    "scratch-long-f0.1-s0",
    "frozen-f1-s0",
    "finetune-f1-s0",
    "scratch-f1-s0",
    "scratch-long-f1-s0",
]


@pytest.mark.slow
def test_every_road_runs_and_the_tables_hold_what_the_runs_wrote(comparison):
    out, status, output = comparison
    assert status == 0, output
    rows = read_csv(out / "points.csv")
    assert [(r["road"], r["fraction"], r["seed"], r["status"]) for r in rows] == [
        ("linear", "0.1", "0", "ok"),
        ("knn", "0.1", "0", "ok"),
        ("finetune", "0.1", "0", "ok"),
        ("distill", "0.1", "0", "ok"),
        ("scratch", "0.1", "0", "ok"),
        ("scratch-long", "0.1", "0", "ok"),
        ("scratch-best", "0.1", "0", "ok"),
        ("linear", "1", "0", "ok"),
        ("knn", "1", "0", "ok"),
        ("finetune", "1", "0", "ok"),
        ("scratch", "1", "0", "ok"),
        ("scratch-long", "1", "0", "ok"),
        ("scratch-best", "1", "0", "ok"),
    ]
    runs = out / "runs"
    for row in rows:
        assert float(row["wall_s"]) > 0 and float(row["cpu_s"]) > 0 and 0 <= float(row["top1"]) <= 1
        if row["road"] in ("linear", "knn"):  # the frozen evaluation's JSON, as sslkit-evaluate wrote it
            results = json.loads((out / "points" / f"{row['run']}.json").read_text())["results"]
            assert float(row["top1"]) == pytest.approx(results[f"{row['road']}_top1"], rel=1e-5)
        elif row["road"] != "scratch-best":  # the run's own classifier
            trained = json.loads((runs / row["run"] / "results.json").read_text())["results"]["trained"]
            assert row["metric"] == "finetune_top1"
            assert float(row["top1"]) == pytest.approx(trained["finetune_top1"], rel=1e-5)
    by = {(r["road"], r["fraction"]): r for r in rows}
    for fraction in ("0.1", "1"):
        best, short, long = (by[(road, fraction)] for road in ("scratch-best", "scratch", "scratch-long"))
        assert float(best["top1"]) == max(float(short["top1"]), float(long["top1"]))
        assert best["run"] in (short["run"], long["run"])
        for cost in ("wall_s", "cpu_s"):  # what the figure cost: both runs
            assert float(best[cost]) == pytest.approx(float(short[cost]) + float(long[cost]), abs=0.2)

    # What each run was given: the pretrained backbone, the labels, the teacher; scratch from random weights.
    def config(name: str) -> dict:
        import yaml

        return yaml.safe_load((runs / name / "config.yaml").read_text())

    assert config("finetune-f0.1-s0")["run"]["init_from"] == str(runs / "pretrain")
    assert config("distill-f0.1-s0")["method"]["teacher"] == str(runs / "finetune-f0.1-s0")
    assert config("scratch-f0.1-s0")["run"]["init_from"] is None
    assert config("scratch-long-f0.1-s0")["train"]["epochs"] == 2 * config("scratch-f0.1-s0")["train"]["epochs"] == 2
    assert config("finetune-f1-s0")["data"]["label_fraction"] == 1.0

    # The same labelled images on every trained road at 10%: the comparison is fair.
    subsets = {
        name: json.loads((runs / name / "label_subset.json").read_text())
        for name in ("finetune-f0.1-s0", "distill-f0.1-s0", "scratch-f0.1-s0", "scratch-long-f0.1-s0")
    }
    first = subsets["finetune-f0.1-s0"]
    assert (first["fraction"], first["seed"]) == (0.1, 0) and len(first["indices"]) > 0
    assert all(subset == first for subset in subsets.values())

    summary = read_csv(out / "summary.csv")
    assert [(r["fraction"], r["road"], r["n_ok"], r["n_failed"]) for r in summary] == [
        (r["fraction"], r["road"], "1", "0") for r in rows
    ]
    assert all(s["top1_mean"] == r["top1"] and s["top1_std"] == "" for s, r in zip(summary, rows))  # one seed
    assert (out / le.PLOT_FILE).read_bytes().startswith(PNG_MAGIC)
    recorded = json.loads((out / "points.json").read_text())
    assert [r["name"] for r in recorded["runs"]] == RUNS and recorded["fractions"] == ["0.1", "1"]
    assert "[10/10] scratch-long-f1-s0: ok" in output and "mean ± std" in output
    for name in RUNS:
        assert (out / "logs" / f"{name}.err").is_file()


@pytest.mark.slow
def test_rerun_skips_every_finished_run_and_redoes_an_unfinished_one(comparison, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(comparison[0], out)
    argv = [*COMPARISON, "--out", str(out)]  # OUT moved: the runs' paths to each other move with it
    before = read_csv(out / "points.csv")
    status, stdout, stderr = run_tool(*argv)
    assert status == 0, stdout + stderr
    assert stdout.count("done, skipped") == len(RUNS)
    after = read_csv(out / "points.csv")
    assert [r["skipped"] for r in after] == ["True"] * len(after)
    # the skipped runs keep their figures and the wall and CPU times of the runs that made them
    assert [(r["top1"], r["wall_s"], r["cpu_s"]) for r in after] == [
        (r["top1"], r["wall_s"], r["cpu_s"]) for r in before
    ]
    # ... also after a command over part of the grid rewrote the tables with its own rows only
    narrow = [("1" if a == "0.1,1" else a) for a in argv]
    assert run_tool(*narrow)[0] == 0 and {r["fraction"] for r in read_csv(out / "points.csv")} == {"1"}
    assert run_tool(*argv)[0] == 0
    assert [(r["top1"], r["wall_s"]) for r in read_csv(out / "points.csv")] == [
        (r["top1"], r["wall_s"]) for r in before
    ]

    (out / "points" / "frozen-f1-s0.json").unlink()  # as if stopped while this evaluation ran
    status, stdout, stderr = run_tool(*argv)
    assert status == 0, stdout + stderr
    assert stdout.count("done, skipped") == len(RUNS) - 1 and "frozen-f1-s0: ok" in stdout
    assert (out / "points" / "frozen-f1-s0.json").is_file()


@pytest.mark.slow
def test_rerun_with_other_settings_into_the_same_out_is_refused(comparison):
    out = comparison[0]
    status, stdout, stderr = run_tool(*COMPARISON, "--finetune-override", "optim.lr=0.01", "--out", str(out))
    assert status == 2
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "optim.lr=0.001" in lines[0] and "optim.lr=0.01" in lines[0], stderr
    assert "done, skipped" not in stdout


@pytest.mark.slow
def test_aggregation_of_the_real_results_without_matplotlib(comparison, tmp_path, monkeypatch):
    out = tmp_path / "copy"
    shutil.copytree(comparison[0], out)
    for name in ("summary.csv", "points.csv", "gains.csv", le.PLOT_FILE):
        (out / name).unlink()
    records = json.loads((out / "points.json").read_text())["runs"]
    block_matplotlib(monkeypatch)
    summary = le.write_tables(out, records, {})
    assert le.plot(summary, 1, out / le.PLOT_FILE) is None and not (out / le.PLOT_FILE).exists()
    assert read_csv(out / "summary.csv") == read_csv(comparison[0] / "summary.csv")
    assert read_csv(out / "points.csv") == read_csv(comparison[0] / "points.csv")
    assert read_csv(out / "gains.csv") == read_csv(comparison[0] / "gains.csv")


# --------------------------------------------------------------------------- chosen labels and FixMatch, for real

# 50 labels (5 of each digit) drawn class-balanced and chosen by TypiClust, every road on each, FixMatch too.
CHOSEN = [
    *TINY,
    "--labels",
    "50",
    "--select",
    "balanced,typiclust",
    "--fixmatch",
    "--seeds",
    "1",
    "--scratch-factor",
    "2",
    "--pretrain-override",
    "train.epochs=1",
    *(
        arg
        for override in ["train.epochs=1", "train.batch_size=16", "eval.linear_epochs=0"]
        for arg in ("--finetune-override", override)
    ),
]
CHOSEN_ROADS = [
    *("frozen", "finetune", "distill", "fixmatch", "fixmatch-distill", "fixmatch-scratch", "scratch", "scratch-long")
]
CHOSEN_RUNS = [
    "pretrain",
    "embed",
    *(f"{kind}-n50-s0" for kind in CHOSEN_ROADS),
    "select-typiclust-n50-s0",
    *(f"{kind}-typiclust-n50-s0" for kind in CHOSEN_ROADS),
]


@pytest.fixture(scope="module")
def chosen(tmp_path_factory) -> tuple[Path, int, str]:
    out = tmp_path_factory.mktemp("label_efficiency") / "chosen"
    status, stdout, stderr = run_tool(*CHOSEN, "--out", str(out))
    return out, status, stdout + stderr


@pytest.mark.slow
def test_labels_chosen_by_a_strategy_go_down_every_road_and_fixmatch_too(chosen):
    out, status, output = chosen
    assert status == 0, output
    recorded = json.loads((out / "points.json").read_text())
    assert [r["name"] for r in recorded["runs"]] == CHOSEN_RUNS
    assert (recorded["labels"], recorded["select"], recorded["classes"]) == ([50], ["balanced", "typiclust"], 10)

    # Every typiclust road trained (or was evaluated) on exactly the images of the label file sslkit-select wrote.
    label_file = json.loads((out / "labels" / "typiclust-n50-s0.json").read_text())
    assert (label_file["strategy"], label_file["budget"], len(label_file["indices"])) == ("typiclust", 50, 50)
    assert label_file["embeddings"]["count"] == 1437  # chosen among every image of the digits' training split
    runs = out / "runs"
    for kind in CHOSEN_ROADS[1:]:
        saved = json.loads((runs / f"{kind}-typiclust-n50-s0" / "label_subset.json").read_text())
        assert saved["indices"] == label_file["indices"], kind
        assert saved["file"] == str(out / "labels" / "typiclust-n50-s0.json")
    balanced = json.loads((runs / "finetune-n50-s0" / "label_subset.json").read_text())
    assert (balanced["per_class"], balanced["seed"], len(balanced["indices"])) == (5, 0, 50)
    assert balanced["indices"] != label_file["indices"]

    def config(name: str) -> dict:
        import yaml

        return yaml.safe_load((runs / name / "config.yaml").read_text())

    fixmatch, from_scratch = config("fixmatch-typiclust-n50-s0"), config("fixmatch-scratch-typiclust-n50-s0")
    assert fixmatch["method"]["name"] == from_scratch["method"]["name"] == "fixmatch"
    assert (fixmatch["run"]["init_from"], from_scratch["run"]["init_from"]) == (str(runs / "pretrain"), None)
    student = config("fixmatch-distill-typiclust-n50-s0")  # FixMatch's result teaches a student from the encoder
    assert (student["method"]["name"], student["run"]["init_from"]) == ("distill", str(runs / "pretrain"))
    assert student["method"]["teacher"] == str(runs / "fixmatch-typiclust-n50-s0")

    rows = read_csv(out / "points.csv")
    by = {(r["selection"], r["road"]): r for r in rows}
    roads = ["linear", "knn", *CHOSEN_ROADS[1:]]
    for selection in ("balanced", "typiclust"):
        for road in [*roads, "scratch-best"]:
            row = by[(selection, road)]
            assert (row["budget"], row["fraction"], row["labels"], row["status"]) == ("50", "", "50", "ok"), row
            assert 0 <= float(row["top1"]) <= 1
    for road in ("fixmatch", "fixmatch-distill", "fixmatch-scratch"):  # the run's own classifier, as it reported it
        trained = json.loads((runs / f"{road}-typiclust-n50-s0" / "results.json").read_text())["results"]["trained"]
        assert float(by[("typiclust", road)]["top1"]) == pytest.approx(trained["finetune_top1"], rel=1e-5)
    assert len(rows) == 2 * (len(roads) + 1)

    summary = read_csv(out / "summary.csv")
    assert [(r["selection"], r["road"]) for r in summary] == [
        (s, road) for s in ("balanced", "typiclust") for road in [*roads, "scratch-best"]
    ]
    gains = read_csv(out / "gains.csv")
    assert {(g["selection"], g["road"], g["versus"]) for g in gains} == {
        *(
            (s, road, versus)
            for s in ("balanced", "typiclust")
            for road, versus in (*registry.PRETRAINING, *registry.UNLABELLED)
        ),
        *(("typiclust", road, "balanced") for road in registry.SELECTION_ROADS),
    }
    assert "what selection buys" in output and "with balanced" in output
    assert (out / le.PLOT_FILE).read_bytes().startswith(PNG_MAGIC)


# --------------------------------------------------------------------------- mistakes, up front


def test_a_bad_fraction_gives_one_line_from_the_command(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "sslkit.cli.label_efficiency", "quickstart", "--fractions", "0.1,1.5"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "1.5" in lines[0] and "(0, 1]" in lines[0], result.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--fractions", "0,0.1"], ["'0,0.1'", "(0, 1]"]),
        (["--fractions", "0.1,2"], ["2 is outside (0, 1]"]),
        (["--fractions", "0.1,ten"], ["'ten' is not a number"]),
        (["--fractions", "0.1,0.10"], ["twice"]),
        (["--fractions", "0.1", "--seeds", "0"], ["--seeds must be at least 1"]),
        (["--fractions", "0.1", "--scratch-factor", "0"], ["--scratch-factor"]),
        (["--fractions", "0.1,1", "--epochs", "0.5=3"], ["--epochs '0.5=3'", "not one of --fractions 0.1,1"]),
        (["--fractions", "0.1,1", "--epochs", "1=three"], ["'1=three' is not FRACTION=EPOCHS"]),
        (["--fractions", "0.1,1", "--epochs", "1=0"], ["1=0", "at least 1 epoch"]),
        (["--fractions", "0.1", "data.label_fraction=0.5"], ["data.label_fraction", "--fractions"]),
        (["--fractions", "0.1", "run.name=mine"], ["run.name", "--out"]),
        (["--fractions", "0.1", "--finetune-override", "run.seed=3"], ["--finetune-override 'run.seed=3'"]),
        (["--fractions", "0.1", "train.epohcs=3"], ["train.epohcs", "epochs"]),  # a typo, caught for the pretraining
        (["--fractions", "0.1", "--finetune-override", "optim.lr=-1"], ["fine-tune recipe", "optim.lr"]),
        (["--fractions", "0.1", "--finetune-recipe", "nosuch"], ["recipe 'nosuch' not found"]),
        (["--fractions", "0.1", "--pretrained", "nowhere"], ["--pretrained 'nowhere'", "config.yaml"]),
        (["--fractions", "0.1", "--pretrain-override", "train.epochs=3", "--pretrained", "x"], ["--pretrained"]),
        (  # the pretrained backbone would not load into the fine-tuned network
            ["--fractions", "0.1", "--pretrain-override", "model.width=8"],
            ["run finetune-f0.1-s0: model.width=16", "pretrained encoder has model.width=8"],
        ),
        (  # the fine-tune keeps a projector layer the pretraining's projector does not have in that width
            ["--fractions", "0.1", "--finetune-override", "method.finetune_from_projector_layer=1"],
            ["run finetune-f0.1-s0: model.projector_hidden=2048", "pretrained encoder has model.projector_hidden="],
        ),
        (
            ["--fractions", "0.1", "--finetune-recipe", "fashion_mnist_finetune"],
            ["data.name=fashion_mnist", "data.name=digits", "--finetune-recipe"],
        ),
    ],
)
def test_mistakes_fail_before_anything_runs(tmp_path, argv, words):
    check_one_line_and_nothing_written(tmp_path, argv, words)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--fractions", "0.1", "--labels", "50"], ["--fractions", "--labels", "one of the two; both given"]),
        ([], ["--fractions", "--labels", "neither given"]),
        (["--labels", "50,ten"], ["'ten' is not a whole number"]),
        (["--labels", "0"], ["0 labels leave nothing"]),
        (["--labels", "50,50"], ["twice"]),
        (["--labels", "5000", "--select", "random"], ["--labels 5000", "has 1437 images", "at most 1437"]),
        (["--labels", "55"], ["--labels 55", "10 classes of digits", "multiple of 10, e.g. 50 or 60"]),
        (["--labels", "5"], ["multiple of 10, e.g. 10"]),
        (["--labels", "1430"], ["--labels 1430", "143 images of every class", "only 139"]),
        (["--labels", "20"], ["run finetune-n20-s0", "--labels 20 leaves 20 labelled images", "batch_size 32"]),
        (
            ["--labels", "50", "--select", "random,typiclus"],
            ["unknown selection 'typiclus'", "balanced, random, kmeans, typiclust, probcover, kcenter"],
        ),
        (["--labels", "50", "--select", "random,random"], ["--select 'random,random'", "twice"]),
        (["--fractions", "0.0001", "--select", "random"], ["--fractions 0.0001", "no image for --select"]),
        (["--fractions", "1", "--fixmatch"], ["--fixmatch needs unlabelled", "every budget labels all 1437"]),
        (["--labels", "1437", "--select", "kmeans"], ["--select kmeans chooses images", "add a smaller budget"]),
        (["--labels", "50", "--select", "kcenter", "data.holdout_classes=[0]"], ["data.holdout_classes"]),
        (["--labels", "50", "--epochs", "0.1=3"], ["--epochs '0.1=3'", "not one of --labels 50"]),
        (["--labels", "50", "data.label_subset=mine.json"], ["data.label_subset", "--select"]),
        (  # a FixMatch step of 7 x 300 unlabelled digits: more than there are
            ["--labels", "500", "--fixmatch", "--finetune-override", "train.batch_size=300"],
            ["run fixmatch-n500-s0", "300 x 7", "more than the 1437", "train.batch_size=205"],
        ),
        (
            ["--labels", "50", "--fixmatch", "--fixmatch-recipe", "fashion_mnist_fixmatch"],
            ["run fixmatch-n50-s0: data.name=fashion_mnist", "--fixmatch-recipe"],
        ),
        (["--labels", "50", "--fixmatch-override", "train.epochs=20"], ["--fixmatch-override", "without --fixmatch"]),
    ],
)
def test_budget_selection_and_fixmatch_mistakes_fail_before_anything_runs(tmp_path, argv, words):
    check_one_line_and_nothing_written(tmp_path, argv, words)


def check_one_line_and_nothing_written(tmp_path: Path, argv: list[str], words: list[str]) -> None:
    status, stdout, stderr = run_tool(*argv, "--out", str(tmp_path / "out"))
    assert status == 2, stdout + stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_an_unknown_recipe_fails_before_anything_runs(tmp_path):
    status, _, stderr = run_tool("--fractions", "0.1", "--out", str(tmp_path / "out"), recipe="nosuch")
    assert status == 2 and "recipe 'nosuch' not found" in stderr and len(stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- the plan


POOL = LabelPool("digits", (100,) * 10)  # 1,000 labelled images, 100 of each class


def make_plan(tmp_path: Path, **changes) -> le.Plan:
    settings = dict(
        recipe=Path("/r/pre.yaml"),
        finetune_recipe=Path("/r/ft.yaml"),
        distill_recipe=Path("/r/di.yaml"),
        overrides=["train.threads=2"],
        pretrain_overrides=["train.epochs=7"],
        finetune_overrides=["train.epochs=5"],
        fixmatch_overrides=[],
        fixmatch_recipe=None,
        budgets=[Budget(fraction=0.01), Budget(fraction=1.0)],
        selections=["balanced"],
        seeds=[3, 4],
        pool=POOL,
        out=tmp_path,
        pretrained=None,
        scratch_factor=3,
        finetune_epochs=5,
        scratch_recipe=Path("/r/ft.yaml"),
        scratch_epochs=5,
        epochs={},
        launcher=None,
    )
    return le.Plan(**{**settings, **changes})


def test_runs_in_order_with_the_users_commands(tmp_path):
    runs = le.plan_runs(make_plan(tmp_path))
    per_seed = ["frozen", "finetune", "distill", "scratch", "scratch-long"]
    assert [r.name for r in runs] == [
        "pretrain",
        *(f"{kind}-f0.01-s{seed}" for seed in (3, 4) for kind in per_seed),
        *(f"{kind}-f1-s{seed}" for seed in (3, 4) for kind in per_seed if kind != "distill"),  # nothing to distill on
    ]
    by = {r.name: r for r in runs}
    pre, python = tmp_path / "runs" / "pretrain", sys.executable
    tail = ["run.output_dir=" + str(tmp_path / "runs"), "run.resume=auto"]
    assert by["pretrain"].command == [
        python,
        "-m",
        "sslkit.cli.pretrain",
        "/r/pre.yaml",
        "train.threads=2",
        "train.epochs=7",
        tail[0],
        "run.name=pretrain",
        tail[1],
    ]
    frozen = by["frozen-f0.01-s4"]
    assert frozen.command == [
        python,
        "-m",
        "sslkit.cli.evaluate",
        str(pre),
        "train.threads=2",
        "eval.label_fraction=0.01",
        "data.label_seed=4",
        "run.seed=4",
        "--out",
        str(tmp_path / "points" / "frozen-f0.01-s4.json"),
    ]
    assert frozen.needs == ("pretrain",) and (frozen.fraction, frozen.seed) == (0.01, 4)
    labels = ["data.label_fraction=0.01", "data.label_seed=4", "run.seed=4"]
    assert by["finetune-f0.01-s4"].command[3:] == [
        "/r/ft.yaml",
        "train.threads=2",
        "train.epochs=5",
        f"run.init_from={pre}",
        *labels,
        tail[0],
        "run.name=finetune-f0.01-s4",
        tail[1],
    ]
    distill = by["distill-f0.01-s4"]
    assert distill.command[3:7] == [
        "/r/di.yaml",
        "train.threads=2",
        "train.epochs=5",
        f"method.teacher={tmp_path / 'runs' / 'finetune-f0.01-s4'}",
    ]
    assert distill.needs == ("pretrain", "finetune-f0.01-s4")
    scratch, long = by["scratch-f0.01-s4"], by["scratch-long-f0.01-s4"]
    assert scratch.command[3:] == [
        "/r/ft.yaml",
        "train.threads=2",
        "train.epochs=5",
        "run.init_from=null",
        *labels,
        tail[0],
        "run.name=scratch-f0.01-s4",
        tail[1],
    ]
    assert long.command[5:8] == ["train.epochs=5", "train.epochs=15", "run.init_from=null"]  # the later one wins
    assert scratch.needs == long.needs == ()  # they run even when the pretraining failed
    assert by["scratch-f1-s3"].result == tmp_path / "runs" / "scratch-f1-s3" / "results.json"


def test_pretrained_run_no_distill_factor_one_and_launcher(tmp_path):
    pretrained = tmp_path / "mine"
    plan = make_plan(
        tmp_path, pretrained=pretrained, distill_recipe=None, scratch_factor=1, launcher="accelerate launch --cpu"
    )
    runs = le.plan_runs(plan)
    assert [r.name for r in runs] == [
        f"{kind}-f{f}-s{seed}" for f in ("0.01", "1") for seed in (3, 4) for kind in ("frozen", "finetune", "scratch")
    ]
    assert runs[0].command[:5] == ["accelerate", "launch", "--cpu", "-m", "sslkit.cli.evaluate"]
    assert runs[0].command[5] == str(pretrained) and runs[0].needs == ()
    assert f"run.init_from={pretrained}" in runs[1].command and runs[1].needs == ()


def test_epochs_at_a_fraction_go_to_its_fine_tune_and_scratch_runs_only(tmp_path):
    runs = {r.name: r for r in le.plan_runs(make_plan(tmp_path, epochs={"1": 2}))}
    assert runs["finetune-f1-s3"].command[5:7] == ["train.epochs=5", "train.epochs=2"]  # the later one wins
    assert "train.epochs=2" in runs["scratch-f1-s3"].command
    assert "train.epochs=6" in runs["scratch-long-f1-s3"].command  # --scratch-factor times the fraction's epochs
    for name in ("finetune-f0.01-s3", "distill-f0.01-s3", "scratch-f0.01-s3"):
        assert "train.epochs=2" not in runs[name].command
    assert "train.epochs=15" in runs["scratch-long-f0.01-s3"].command
    assert le.parse_epochs("0.01=60,1.0=3", [0.01, 1.0]) == {"0.01": 60, "1": 3}


def test_a_scratch_recipe_of_its_own_sets_the_scratch_runs_and_their_longer_epochs(tmp_path):
    plan = make_plan(tmp_path, scratch_recipe=Path("/r/scratch.yaml"), scratch_epochs=100, finetune_overrides=[])
    runs = {r.name: r for r in le.plan_runs(plan)}
    for name in ("scratch-f0.01-s3", "scratch-long-f0.01-s3"):
        assert runs[name].command[3] == "/r/scratch.yaml"
    assert runs["finetune-f0.01-s3"].command[3] == "/r/ft.yaml"
    assert "train.epochs=300" in runs["scratch-long-f0.01-s3"].command  # --scratch-factor times its own epochs


def test_labels_chosen_by_a_strategy_are_embedded_once_selected_per_seed_and_given_to_every_road(tmp_path):
    budgets = [Budget(count=50), Budget(count=1000)]  # 1000: every label of POOL
    fixmatch_at_length = {"fixmatch_recipe": Path("/r/fm.yaml"), "fixmatch_overrides": ["train.epochs=20"]}
    plan = make_plan(tmp_path, budgets=budgets, selections=["balanced", "typiclust"], **fixmatch_at_length)
    runs = le.plan_runs(plan)
    assert [r.name for r in runs] == [
        "pretrain",
        "embed",
        *(
            name
            for seed in (3, 4)
            for name in (
                *(f"{kind}-n50-s{seed}" for kind in CHOSEN_ROADS),
                f"select-typiclust-n50-s{seed}",
                *(f"{kind}-typiclust-n50-s{seed}" for kind in CHOSEN_ROADS),
            )
        ),
        # every label, once per seed: no selection, nothing to distill on, nothing unlabelled for FixMatch
        *(f"{kind}-n1000-s{seed}" for seed in (3, 4) for kind in ("frozen", "finetune", "scratch", "scratch-long")),
    ]
    by = {r.name: r for r in runs}
    pre, python, embeddings = tmp_path / "runs" / "pretrain", sys.executable, tmp_path / "embeddings"
    embed = by["embed"]
    assert embed.command == [
        *(python, "-m", "sslkit.cli.embed", str(pre), "train.threads=2"),
        *("--split", "train", "--out", str(embeddings)),
    ]
    assert (embed.needs, embed.result) == (("pretrain",), embeddings / "meta.json")
    assert embed.job().complete_key == "complete"
    label_file = tmp_path / "labels" / "typiclust-n50-s4.json"
    select = by["select-typiclust-n50-s4"]
    assert select.command == [
        *(python, "-m", "sslkit.cli.label_selection", str(embeddings), "--budget", "50", "--strategy", "typiclust"),
        *("--seed", "4", "--out", str(label_file)),
    ]
    assert (select.needs, select.result) == (("embed",), label_file)

    chosen = ["data.label_fraction=null", "data.labels_per_class=null", f"data.label_subset={label_file}"]
    frozen = by["frozen-typiclust-n50-s4"]
    assert frozen.command[4:-2] == [
        "train.threads=2",
        *chosen,
        "eval.label_fraction=null",
        "eval.labels_per_class=null",
        "run.seed=4",
    ]
    assert frozen.needs == ("pretrain", "select-typiclust-n50-s4")
    tail = [f"run.output_dir={tmp_path / 'runs'}", "run.name=finetune-typiclust-n50-s4", "run.resume=auto"]
    finetune = by["finetune-typiclust-n50-s4"]
    assert finetune.command[3:] == ["/r/ft.yaml", "train.threads=2", "train.epochs=5", f"run.init_from={pre}"] + [
        *chosen,
        "run.seed=4",
        *tail,
    ]
    assert finetune.job().fields == {
        **{"kind": "finetune", "fraction": None, "seed": 4},
        **{"selection": "typiclust", "budget": "50", "labels": 50},
    }
    for kind in CHOSEN_ROADS[1:]:
        assert f"data.label_subset={label_file}" in by[f"{kind}-typiclust-n50-s4"].command
        assert "select-typiclust-n50-s4" in by[f"{kind}-typiclust-n50-s4"].needs
    fixmatch, from_scratch = by["fixmatch-typiclust-n50-s4"], by["fixmatch-scratch-typiclust-n50-s4"]
    at_length = ["/r/fm.yaml", "train.threads=2", "train.epochs=5", "train.epochs=20"]  # --fixmatch-override last
    assert fixmatch.command[3:8] == [*at_length, f"run.init_from={pre}"]
    assert from_scratch.command[3:8] == [*at_length, "run.init_from=null"]
    assert (fixmatch.needs, from_scratch.needs) == (
        ("pretrain", "select-typiclust-n50-s4"),
        ("select-typiclust-n50-s4",),
    )
    student = by["fixmatch-distill-typiclust-n50-s4"]  # taught by FixMatch's run, on the same labels
    assert f"method.teacher={tmp_path / 'runs' / 'fixmatch-typiclust-n50-s4'}" in student.command
    assert student.needs == ("pretrain", "fixmatch-typiclust-n50-s4", "select-typiclust-n50-s4")
    assert "train.epochs=20" not in student.command  # the distill recipe's own epochs

    # 50 labels drawn class-balanced: 5 of each of the 10 classes, for the probes as for the trained runs
    assert by["frozen-n50-s3"].command[5:-2] == [
        "eval.label_fraction=null",
        "eval.labels_per_class=5",
        "data.label_seed=3",
        "run.seed=3",
    ]
    assert by["scratch-n50-s3"].command[7:11] == [
        "data.label_fraction=null",
        "data.labels_per_class=5",
        "data.label_seed=3",
        "run.seed=3",
    ]
    assert by["scratch-n50-s3"].needs == ()
    every = by["finetune-n1000-s3"]
    assert "data.label_fraction=1" in every.command and every.tags == {
        "selection": "all",
        "budget": "1000",
        "labels": 1000,
    }


def test_a_fraction_chosen_by_a_strategy_is_that_share_of_the_images(tmp_path):
    plan = make_plan(tmp_path, selections=["kcenter"], scratch_factor=1, distill_recipe=None)
    runs = {r.name: r for r in le.plan_runs(plan)}
    select = runs["select-kcenter-f0.01-s3"]
    assert select.command[select.command.index("--budget") + 1] == "10"  # 0.01 of POOL's 1000 images
    assert select.result == tmp_path / "labels" / "kcenter-f0.01-s3.json"
    assert runs["finetune-kcenter-f0.01-s3"].tags == {"selection": "kcenter", "budget": "0.01", "labels": 10}
    assert "finetune-f1-s3" in runs and "select-kcenter-f1-s3" not in runs  # every label: nothing to choose
    assert le.parse_epochs("50=60", [50.0, 600.0], "--labels") == {"50": 60}


def test_a_pretraining_with_labels_gets_a_note(tmp_path):
    assert le.labels_note(make_plan(tmp_path, recipe=find_recipe("quickstart"), pretrain_overrides=[])) is None
    note = le.labels_note(make_plan(tmp_path, recipe=find_recipe("supcon"), pretrain_overrides=[]))
    assert note.startswith("note: the pretraining (method.name=supcon) trains with labels, all of them")


def test_pretrained_must_be_a_finished_run(tmp_path):
    (tmp_path / "config.yaml").write_text("data: {name: digits}\n")
    with pytest.raises(UserError, match="has not finished"):
        le.pretrained_run(tmp_path)
    (tmp_path / "results.json").write_text("{}")
    assert le.pretrained_run(tmp_path) == tmp_path.resolve()


def test_parse_fractions_sorts_and_names_them_plainly():
    assert lb.parse_fractions("1,0.01, 0.1") == [0.01, 0.1, 1.0]
    assert [fraction_text(f) for f in lb.parse_fractions("1.0,0.001")] == ["0.001", "1"]
    labels = lb.LabelSet("balanced", Budget(fraction=1.0), 0, POOL, Path("labels"))
    assert labels.run_name("scratch-long") == "scratch-long-f1-s0"


def test_a_run_is_a_job_that_reads_its_own_result():
    frozen = Run("frozen-f0.1-s0", "frozen", 0.1, 0, "sslkit.cli.evaluate", ["x"], Path("p.json"), ("pretrain",)).job()
    assert (frozen.metrics_at, frozen.needs) == (("results",), ("pretrain",))
    assert frozen.shown == ("linear_top1", "knn_top1")
    finetune = Run("finetune-f0.1-s0", "finetune", 0.1, 0, "sslkit.cli.pretrain", ["x"], Path("r/results.json")).job()
    assert finetune.metrics_at == ("results", "trained") and finetune.shown == ("finetune_top1",)
    assert finetune.fields == {"kind": "finetune", "fraction": 0.1, "seed": 0}


# --------------------------------------------------------------------------- aggregation and plot


def record(
    kind: str, fraction: float, seed: int, metrics: dict | None, wall: float | None = 10.0, selection: str = "balanced"
) -> dict:
    """A run's record as the runner writes it, of a run on a class-balanced fraction of POOL's labels (or on labels
    that ``selection`` chose); its CPU time twice its wall time, two busy cores."""
    cpu = None if wall is None else 2 * wall
    if kind == "pretrain":
        return {"name": "pretrain", "kind": kind, "fraction": None, "seed": None, "status": "ok", "skipped": False,
                "error": None, "wall_s": wall, "cpu_s": cpu, "metrics": metrics}  # fmt: skip
    labels = lb.LabelSet(selection, Budget(fraction=fraction), seed, POOL, Path("labels"))
    return {
        "name": labels.run_name(kind),
        "kind": kind,
        "fraction": fraction,
        "seed": seed,
        **labels.fields(),
        "status": "failed" if metrics is None else "ok",
        "skipped": False,
        "error": "boom" if metrics is None else None,
        "wall_s": wall,
        "cpu_s": cpu,
        "metrics": metrics or {},
    }


# The roads of RECORDS: no distill or FixMatch runs.
TRAINED_ROADS = [road for road in registry.ROADS if "distill" not in road and "fixmatch" not in road]


def ft(top1: float) -> dict:
    return {"knn_top1": 0.0, "finetune_top1": top1}


RECORDS = [
    record("pretrain", None, None, {"knn_top1": 0.9}, wall=100.0),
    record("frozen", 0.1, 0, {"knn_top1": 0.80, "linear_top1": 0.70}),
    record("finetune", 0.1, 0, ft(0.60)),
    record("scratch", 0.1, 0, ft(0.30)),
    record("scratch-long", 0.1, 0, ft(0.40), wall=30.0),
    record("frozen", 0.1, 1, {"knn_top1": 0.82, "linear_top1": 0.90}),
    record("finetune", 0.1, 1, None),
    record("scratch", 0.1, 1, ft(0.50)),
    record("scratch-long", 0.1, 1, ft(0.45), wall=30.0),
    record("frozen", 1.0, 0, {"knn_top1": 0.95}),  # eval.linear_epochs=0: no linear_top1
    record("finetune", 1.0, 0, ft(0.97)),
    record("scratch", 1.0, 0, ft(0.90)),
    record("scratch-long", 1.0, 0, None),
]


def test_rows_are_roads_and_scratch_best_is_the_better_of_the_two():
    rows = le.point_rows(RECORDS)
    by = {(r["road"], r["fraction"], r["seed"]): r for r in rows}
    assert len(rows) == 18  # per fraction and seed: linear, knn, finetune, scratch, scratch-long, scratch-best
    assert (by[("linear", 0.1, 1)]["top1"], by[("knn", 0.1, 1)]["top1"]) == (0.90, 0.82)
    assert by[("linear", 0.1, 1)]["run"] == "frozen-f0.1-s1"
    best = by[("scratch-best", 0.1, 0)]
    assert (best["top1"], best["run"], best["wall_s"]) == (0.40, "scratch-long-f0.1-s0", 40.0)
    assert (by[("scratch-best", 0.1, 1)]["top1"], by[("scratch-best", 0.1, 1)]["run"]) == (0.50, "scratch-f0.1-s1")
    failed = by[("scratch-best", 1.0, 0)]
    assert failed["status"] == "failed" and failed["top1"] is None and "scratch-long-f1-s0 failed" in failed["error"]
    missing = by[("linear", 1.0, 0)]
    assert missing["status"] == "failed" and "no linear_top1" in missing["error"]
    assert by[("finetune", 0.1, 1)]["error"] == "boom"


def test_without_long_scratch_runs_scratch_best_is_the_scratch_run():
    records = [r for r in RECORDS if r["kind"] != "scratch-long"]
    rows = le.point_rows(records, long_runs=False)
    assert [r["road"] for r in rows][-2:] == ["scratch", "scratch-best"]
    best = [r for r in rows if r["road"] == "scratch-best"]
    assert [(r["top1"], r["run"], r["wall_s"]) for r in best] == [
        (0.30, "scratch-f0.1-s0", 10.0),
        (0.50, "scratch-f0.1-s1", 10.0),
        (0.90, "scratch-f1-s0", 10.0),
    ]
    # with long runs planned, a scratch run alone (its long run still to come) gives no best yet
    assert not [r for r in le.point_rows(records) if r["road"] == "scratch-best"]


def test_gains_pair_each_seed_with_its_own_scratch_run():
    # seed 0: 0.60 - 0.40; seed 1's fine-tune failed and fraction 1's scratch best too: nothing to pair
    assert le.paired_gains(le.point_rows(RECORDS)) == [
        {
            "selection": "balanced",
            "budget": "0.1",
            "fraction": 0.1,
            "labels": 100,
            "road": "finetune",
            "versus": "scratch-best",
            "n_seeds": 1,
            "gain_mean": pytest.approx(0.2),
            "gain_std": None,
            "seeds_ahead": 1,
        }
    ]
    records = []
    for seed, (tuned, taught, scratch) in enumerate([(0.8, 0.85, 0.7), (0.7, 0.7, 0.75), (0.6, 0.7, 0.5)]):
        records += [record("finetune", 0.01, seed, ft(tuned)), record("distill", 0.01, seed, ft(taught))]
        records += [record("scratch", 0.01, seed, ft(scratch)), record("scratch-long", 0.01, seed, ft(scratch - 0.1))]
    finetune, distill = le.paired_gains(le.point_rows(records))
    assert (finetune["road"], finetune["n_seeds"], finetune["seeds_ahead"]) == ("finetune", 3, 2)
    assert finetune["gain_mean"] == pytest.approx(0.05)
    assert finetune["gain_std"] == pytest.approx(statistics.stdev([0.1, -0.05, 0.1]))
    assert (distill["gain_mean"], distill["seeds_ahead"]) == (pytest.approx(0.1), 2)  # 0.15, -0.05, 0.2
    table = le.gains_table([finetune, distill])
    assert [c.header for c in table.columns] == ["labels", "finetune\n- scratch-best", "distill\n- scratch-best"]
    assert "what pretraining buys" in table.title


def test_what_the_unlabelled_images_buy_pairs_each_road_with_its_start_without_them(tmp_path):
    records = []
    for seed, (tuned, fixmatch, alone, scratch) in enumerate([(0.6, 0.7, 0.55, 0.5), (0.62, 0.66, 0.6, 0.52)]):
        records += [record("finetune", 0.01, seed, ft(tuned)), record("fixmatch", 0.01, seed, ft(fixmatch))]
        records += [record("fixmatch-scratch", 0.01, seed, ft(alone)), record("scratch", 0.01, seed, ft(scratch))]
        records.append(record("fixmatch-distill", 0.01, seed, ft(fixmatch + 0.01)))
    rows = le.point_rows(records, long_runs=False)
    unlabelled = {(g["road"], g["versus"]): g for g in le.paired_gains(rows, registry.UNLABELLED)}
    assert list(unlabelled) == [
        ("fixmatch", "finetune"),
        ("fixmatch-scratch", "scratch-best"),
        ("fixmatch-distill", "fixmatch"),
    ]  # no distill road ran: nothing for its pair
    assert unlabelled[("fixmatch", "finetune")]["gain_mean"] == pytest.approx(0.07)  # 0.1 and 0.04
    assert unlabelled[("fixmatch-scratch", "scratch-best")]["gain_mean"] == pytest.approx(0.065)  # 0.05, 0.08
    assert unlabelled[("fixmatch-distill", "fixmatch")]["seeds_ahead"] == 2
    pretraining = {(g["road"], g["versus"]): g for g in le.paired_gains(rows)}
    assert pretraining[("fixmatch", "fixmatch-scratch")]["gain_mean"] == pytest.approx(0.105)  # 0.15, 0.06
    table = le.gains_table(le.paired_gains(rows, registry.UNLABELLED), registry.UNLABELLED)
    assert "what the unlabelled images buy" in table.title
    assert [c.header for c in table.columns][1:] == [
        "fixmatch\n- finetune",
        "fixmatch-scratch\n- scratch-best",
        "fixmatch-distill\n- fixmatch",
    ]
    le.write_tables(tmp_path, records, {}, long_runs=False)
    written = {(g["road"], g["versus"]) for g in read_csv(tmp_path / "gains.csv")}
    assert written == {*unlabelled, *pretraining}


def test_summary_is_mean_and_sample_std_over_the_seeds_that_succeeded():
    summary = lt.summarize(le.point_rows(RECORDS))
    assert [(r["fraction"], r["road"]) for r in summary][:6] == [(0.1, road) for road in TRAINED_ROADS]
    by = {(r["fraction"], r["road"]): r for r in summary}
    linear = by[(0.1, "linear")]
    assert linear["top1_mean"] == pytest.approx(0.80) and linear["top1_std"] == pytest.approx(
        statistics.stdev([0.7, 0.9])
    )
    assert by[(0.1, "scratch-best")]["top1_mean"] == pytest.approx(0.45)
    assert by[(0.1, "scratch-best")]["wall_s_mean"] == pytest.approx(40.0)
    assert by[(0.1, "scratch-best")]["cpu_s_mean"] == pytest.approx(80.0)
    finetune = by[(0.1, "finetune")]
    assert (finetune["n_ok"], finetune["n_failed"], finetune["top1_mean"], finetune["top1_std"]) == (1, 1, 0.60, None)
    assert by[(1.0, "scratch-best")]["top1_mean"] is None


def test_tables_table_and_plot_from_records(tmp_path):
    summary = le.write_tables(tmp_path, RECORDS, {"recipe": "r.yaml"})
    rows = read_csv(tmp_path / "summary.csv")
    assert rows[0] == {
        "selection": "balanced",
        "budget": "0.1",
        "fraction": "0.1",
        "labels": "100",
        "road": "linear",
        "n_ok": "2",
        "n_failed": "0",
        "top1_mean": "0.8",
        "top1_std": f"{statistics.stdev([0.7, 0.9]):.6g}",
        "wall_s_mean": "10",
        "cpu_s_mean": "20",
    }
    points = read_csv(tmp_path / "points.csv")
    assert len(points) == 18 and points[0]["fraction"] == "0.1" and points[-1]["fraction"] == "1"
    assert read_csv(tmp_path / "gains.csv") == [
        {
            **{"selection": "balanced", "budget": "0.1", "fraction": "0.1", "labels": "100", "road": "finetune"},
            **{"versus": "scratch-best", "n_seeds": "1", "gain_mean": "0.2", "gain_std": "", "seeds_ahead": "1"},
        }
    ]
    saved = json.loads((tmp_path / "points.json").read_text())
    assert saved["recipe"] == "r.yaml" and len(saved["runs"]) == len(RECORDS) and len(saved["points"]) == 18

    table = le.summary_table(summary, RECORDS[0])
    assert [c.header for c in table.columns] == [
        "labels",
        *(registry.column_header(r) for r in TRAINED_ROADS),
    ]
    assert "100 s, 3.3 CPU-min" in table.caption  # the pretraining: 100 s on two busy cores
    assert (
        registry.column_header("finetune") == "fine\ntune"
        and registry.column_header("scratch-long") == "scratch\nlong"
    )

    figure = le.plot(summary, 2, tmp_path / le.PLOT_FILE)
    assert (tmp_path / le.PLOT_FILE).read_bytes().startswith(PNG_MAGIC)
    axes = figure.axes[0]
    assert axes.get_xscale() == "log" and "std over 2 seeds" in axes.get_title()
    assert [t.get_text() for t in axes.get_legend().get_texts()] == [
        "linear probe (frozen)",
        "fine-tune",
        "scratch (better of 1x and 3x epochs)",
    ]
    line, _, _ = axes.containers[2]
    assert list(line.get_xdata()) == [0.1, 1.0] and list(line.get_ydata())[0] == pytest.approx(0.45)


def test_the_plot_is_skipped_without_matplotlib(tmp_path, monkeypatch):
    block_matplotlib(monkeypatch)
    summary = le.write_tables(tmp_path, RECORDS, {})
    assert le.plot(summary, 2, tmp_path / le.PLOT_FILE) is None
    assert not (tmp_path / le.PLOT_FILE).exists() and (tmp_path / "summary.csv").is_file()


def chosen_records() -> list[dict]:
    """Fine-tune and scratch runs at 10% chosen three ways on two seeds, and with every label on one seed."""
    records = []
    tuned = {"random": (0.60, 0.62), "typiclust": (0.70, 0.66), "balanced": (0.64, 0.60)}
    for seed in (0, 1):
        for selection, values in tuned.items():
            top1 = values[seed]
            records += [
                record("finetune", 0.1, seed, ft(top1), selection=selection),
                record("scratch", 0.1, seed, ft(top1 - 0.2), selection=selection),
                record("scratch-long", 0.1, seed, ft(top1 - 0.1), selection=selection),
            ]
    every = [record("finetune", 1.0, 0, ft(0.95), selection="all")]
    every += [record(kind, 1.0, 0, ft(0.85), selection="all") for kind in ("scratch", "scratch-long")]
    return records + every


def test_what_selection_buys_is_each_road_minus_random_on_the_same_seed():
    rows = le.point_rows(chosen_records())
    assert lt.selection_baseline(rows) == "random"
    gains = {(g["selection"], g["road"]): g for g in lt.selection_gains(rows)}
    assert set(gains) == {(s, road) for s in ("typiclust", "balanced") for road in ("finetune", "scratch-best")}
    typiclust = gains[("typiclust", "finetune")]  # 0.70 - 0.60 and 0.66 - 0.62
    assert (typiclust["versus"], typiclust["n_seeds"], typiclust["seeds_ahead"]) == ("random", 2, 2)
    assert typiclust["gain_mean"] == pytest.approx(0.07) and typiclust["labels"] == 100
    assert gains[("balanced", "finetune")]["gain_mean"] == pytest.approx(0.01)  # +0.04, -0.02
    # without random, against balanced; with one selection, against nothing
    without_random = [r for r in rows if r["selection"] != "random"]
    assert {g["versus"] for g in lt.selection_gains(without_random)} == {"balanced"}
    assert lt.selection_gains([r for r in rows if r["selection"] in ("typiclust", "all")]) == []
    # what pretraining buys, per selection
    pretraining = lt.paired_gains(rows)
    assert [(g["selection"], g["road"]) for g in pretraining] == [
        ("random", "finetune"),
        ("typiclust", "finetune"),
        ("balanced", "finetune"),
        ("all", "finetune"),
    ]
    assert all(g["gain_mean"] == pytest.approx(0.1) for g in pretraining)


def test_tables_and_plot_show_every_selection(tmp_path):
    summary = le.write_tables(tmp_path, chosen_records(), {})
    assert [(r["budget"], r["selection"]) for r in summary if r["road"] == "finetune"] == [
        ("0.1", "random"),
        ("0.1", "typiclust"),
        ("0.1", "balanced"),
        ("1", "all"),
    ]
    versus = [(g["selection"], g["road"], g["versus"]) for g in read_csv(tmp_path / "gains.csv")]
    assert ("typiclust", "finetune", "scratch-best") in versus and ("typiclust", "finetune", "random") in versus
    table = le.summary_table(summary, None)
    assert [c.header for c in table.columns][:3] == ["labels", "selection", "fine\ntune"]
    assert list(table.columns[1].cells) == ["random", "typiclust", "balanced", "all"]
    chosen = le.selection_table(le.selection_gains(le.point_rows(chosen_records())))
    assert "with random" in chosen.title and list(chosen.columns[1].cells) == ["typiclust", "balanced"]

    figure = le.plot(summary, 2, tmp_path / le.PLOT_FILE)
    assert (tmp_path / le.PLOT_FILE).read_bytes().startswith(PNG_MAGIC)
    assert [axes.get_title() for axes in figure.axes] == [
        "labels chosen by random",
        "labels chosen by typiclust",
        "class-balanced random draw (reads the labels)",
    ]
    for axes in figure.axes:  # fine-tune and scratch best, each closed by the run with every label
        assert [list(line.get_xdata()) for line, _, _ in axes.containers] == [[0.1, 1.0], [0.1, 1.0]]


def test_the_plot_draws_a_road_from_scratch_dashed_and_open_in_its_pretrained_twins_colour(tmp_path):
    records = [record(kind, 0.1, 0, ft(0.6), selection="random") for kind in ("finetune", "scratch")]
    records += [record(kind, 0.1, 0, ft(0.7), selection="random") for kind in ("fixmatch", "fixmatch-scratch")]
    figure = le.plot(lt.summarize(le.point_rows(records, long_runs=False)), 1, tmp_path / le.PLOT_FILE, 1)
    axes = figure.axes[0]
    lines = {text.get_text(): line for text, (line, _, _) in zip(axes.get_legend().get_texts(), axes.containers)}
    assert list(lines) == ["fine-tune", "FixMatch from the encoder", "scratch", "FixMatch from scratch"]
    for pretrained, scratch in (("fine-tune", "scratch"), ("FixMatch from the encoder", "FixMatch from scratch")):
        assert lines[scratch].get_color() == lines[pretrained].get_color()
        assert (lines[pretrained].get_linestyle(), lines[scratch].get_linestyle()) == ("-", "--")
        assert lines[scratch].get_markerfacecolor() == "white"  # a single budget draws no line: open markers
    assert lines["fine-tune"].get_color() != lines["FixMatch from the encoder"].get_color()


def test_the_frozen_road_probes_an_encoder_whose_recipe_skipped_the_linear_probe(tmp_path):
    """A pretraining run with eval.linear_epochs=0 still gets a linear road: its frozen evaluations probe with the
    default epochs, unless the command's own overrides set eval.linear_epochs."""
    run = tmp_path / "pre"
    run.mkdir()
    import yaml

    from sslkit.config import load_config, to_dict

    encoder = to_dict(load_config(find_recipe("quickstart"), ["eval.linear_epochs=0"]))
    (run / "config.yaml").write_text(yaml.safe_dump(encoder))
    (run / "results.json").write_text("{}")

    def frozen_overrides(*overrides: str) -> list[str]:
        plan = le.plan_label_efficiency("quickstart", "0.1", pretrained=run, out=tmp_path / "out", overrides=overrides)
        return next(r for r in le.plan_runs(plan) if r.kind == "frozen").overrides

    assert "eval.linear_epochs=100" in frozen_overrides()
    assert frozen_overrides("eval.linear_epochs=3").count("eval.linear_epochs=3") == 1
    assert "eval.linear_epochs=100" not in frozen_overrides("eval.linear_epochs=3")
