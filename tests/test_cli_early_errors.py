"""The mistakes users make most come as one line before torch is imported (sslkit.cli.early_checks), in the
library's own words.

Each command runs as its console script does (``main()`` reading ``sys.argv``) in a process of its own, which
then names the heavy libraries it imported: none, for a path that is not there, a misspelled recipe or key, or a
number out of its range. Every line the commands give early is held against the line the library gives for
the same mistake, which it still checks for its callers in Python.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_cli import console_scripts

from sslkit.cli import ablate, compare, duplicates, embed, evaluate, export, label_selection, pretrain, report
from sslkit.cli.early_checks import EMBEDDINGS_FILES, embeddings_folder, is_run_dir
from sslkit.config import load_config
from sslkit.embeddings import read_embeddings, write_embeddings
from sslkit.embeddings import store as embeddings_store
from sslkit.embeddings.duplicates import check_fraction, check_threshold
from sslkit.embeddings.encoders import source_kind
from sslkit.errors import UserError
from sslkit.evaluation.evaluate import plan_evaluation
from sslkit.experiments.compare import plan_comparison
from sslkit.experiments.local import LocalExecutor
from sslkit.experiments.report import is_run_dir as library_is_run_dir
from sslkit.selection.label_file import select_to_file

SCRIPTS = console_scripts()
HEAVY_LIBRARIES = ("torch", "torchvision", "numpy", "kornia", "accelerate", "sklearn", "matplotlib", "timm")

# The console script's call, then the heavy libraries imported by then, as the last line of stdout.
AS_CONSOLE_SCRIPT = f"""
import importlib, sys
module, function = sys.argv[1].split(":")
sys.argv = sys.argv[2:]
try:
    status = getattr(importlib.import_module(module), function)()
finally:
    print("heavy:", *sorted(set({HEAVY_LIBRARIES!r}) & set(sys.modules)))
sys.exit(status)
"""


@pytest.fixture(scope="module")
def where(tmp_path_factory) -> Path:
    """A working directory holding what the mistakes name: a finished embeddings folder, an unfinished one and
    one missing files, a folder of runs, a folder of recipes, YAML that does not parse and an image folder."""
    folder = tmp_path_factory.mktemp("mistakes")
    vectors = np.random.default_rng(0).normal(size=(12, 4)).astype(np.float32)
    write_embeddings(folder / "emb", vectors, [f"img/{i}.png" for i in range(12)], np.arange(12) % 3)
    unfinished = write_embeddings(folder / "unfinished", vectors, [f"{i}" for i in range(12)])
    meta = json.loads((unfinished / "meta.json").read_text())
    (unfinished / "meta.json").write_text(json.dumps({**meta, "complete": False, "rows_done": 4}))
    (folder / "partial").mkdir()
    (folder / "partial" / "meta.json").write_text('{"complete": true}')
    (folder / "runs" / "runs" / "a").mkdir(parents=True)
    (folder / "runs" / "runs" / "a" / "config.yaml").write_text("run: {name: a}\n")
    (folder / "recipes").mkdir()
    (folder / "recipes" / "mine.yaml").write_text("train: {epochs: 1}\n")
    (folder / "broken.yaml").write_text("train: {epochs: 1\n")
    (folder / "images").mkdir()
    (folder / "backbone.safetensors").write_bytes(b"")
    return folder


MISTAKES = [
    ("sslkit-pretrain", ["nosuchrecipe"], "recipe 'nosuchrecipe' not found"),
    ("sslkit-pretrain", ["quickstart", "optim.lrr=0.1"], "unknown key 'optim.lrr'; valid keys in 'optim': name, lr"),
    ("sslkit-pretrain", ["quickstart", "train.epochs=many"], "'train.epochs' must be int, got 'many'"),
    ("sslkit-pretrain", ["recipes"], "recipe 'recipes' is a folder; give a YAML file in it, e.g. recipes/mine.yaml"),
    ("sslkit-pretrain", ["broken.yaml"], "broken.yaml: not valid YAML at line 2"),
    ("sslkit-evaluate", ["nowhere"], "'nowhere' not found; give a run directory (runs/<name>), a checkpoint"),
    ("sslkit-evaluate", ["backbone.safetensors", "--recipe", "quickstrat"], "recipe 'quickstrat' not found"),
    ("sslkit-export", ["nowhere", "--format", "onnx"], "'nowhere' not found; give a run directory (runs/<name>)"),
    ("sslkit-embed", ["nowhere", "--data", "digits"], "'nowhere' not found; give a run directory, a checkpoint"),
    ("sslkit-embed", ["backbone.safetensors", "--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    ("sslkit-ablate", ["nosuchrecipe", "--sweep", "loss.temperature=0.1,0.2"], "recipe 'nosuchrecipe' not found"),
    ("sslkit-ablate", ["quickstart", "--seeds", "0"], "--seeds must be at least 1, got 0"),
    ("sslkit-ablate", ["quickstart", "--variants", "nosuch"], "--variants 'nosuch' not found"),
    ("sslkit-ablate", ["quickstart", "--seeds", "2", "--jobs", "0"], "--jobs must be at least 1, got 0"),
    ("sslkit-label-efficiency", ["quickstart", "--labels", "100", "--jobs", "0"], "--jobs must be at least 1, got 0"),
    ("sslkit-compare", ["quickstart", "--minutes", "1", "--jobs", "-1"], "--jobs must be at least 1, got -1"),
    ("sslkit-label-efficiency", ["quickstart", "--labels", "100", "train.epochz=1"], "unknown key 'train.epochz'"),
    ("sslkit-compare", ["quickstart", "nosuchrecipe", "--minutes", "1"], "recipe 'nosuchrecipe' not found"),
    ("sslkit-compare", ["quickstart", "optim.lrr=1", "--minutes", "1"], "quickstart.yaml: "),
    ("sslkit-report", ["nowhere"], "'nowhere' is not a directory; give a run directory"),
    ("sslkit-report", ["runs"], "holds run directories; give those instead, e.g. sslkit-report runs/runs/*"),
    ("sslkit-show-augmentations", ["nosuchrecipe", "--images", "2"], "recipe 'nosuchrecipe' not found"),
    ("sslkit-write-shards", ["nowhere", "shards/x-%06d.tar"], "nowhere is not a folder of images"),
    ("sslkit-write-shards", ["images", "shards/x.tar"], "the shard pattern shards/x.tar needs a number placeholder"),
    ("sslkit-write-shards", ["images", "x-%06d.tar", "--per-shard", "0"], "--per-shard must be at least 1, got 0"),
    ("sslkit-neighbours", ["nowhere"], "'nowhere' is not a folder; give the output folder of sslkit-embed"),
    ("sslkit-neighbours", ["partial"], "'partial' has no embeddings.npy, items.csv: it is not an embeddings folder"),
    ("sslkit-neighbours", ["emb", "--queries", "unfinished"], "'unfinished' is an unfinished sslkit-embed run (4 of"),
    ("sslkit-duplicates", ["nowhere", "--threshold", "0.9"], "'nowhere' is not a folder"),
    ("sslkit-duplicates", ["emb", "--threshold", "1.5"], "the threshold must be a cosine similarity in (0, 1]"),
    ("sslkit-duplicates", ["emb", "--fraction", "1.5"], "the fraction to remove must be in (0, 1)"),
    ("sslkit-duplicates", ["emb", "--threshold", "0.9", "--against", "nowhere"], "'nowhere' is not a folder"),
    ("sslkit-map", ["nowhere"], "'nowhere' is not a folder; give the output folder of sslkit-embed"),
    ("sslkit-map", ["emb", "--sample", "2"], "--sample must be at least 3, got 2"),
    ("sslkit-select", ["nowhere", "--budget", "5", "--strategy", "typiclust"], "'nowhere' is not a folder"),
    ("sslkit-select", ["emb", "--budget", "5", "--strategy", "typiclus"], "unknown strategy 'typiclus'; choose one"),
    ("sslkit-select", ["emb", "--budget", "5", "--strategy", "kmeans", "--labelled", "none.json"], "'none.json' does"),
]


@pytest.mark.parametrize("command, arguments, words", MISTAKES, ids=[" ".join([c, *a]) for c, a, _ in MISTAKES])
def test_a_common_mistake_is_one_line_and_status_2_without_torch(where, command, arguments, words):
    result = subprocess.run(
        [sys.executable, "-c", AS_CONSOLE_SCRIPT, SCRIPTS[command], command, *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=where,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    *_, heavy = result.stdout.splitlines()
    assert (result.returncode, heavy) == (2, "heavy:"), result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and words in result.stderr, result.stderr
    assert not (where / "shards").exists()  # nothing half-written


def line_of(call) -> str:
    with pytest.raises(UserError) as raised:
        call()
    return str(raised.value)


# The command's early check and the library's for the same mistake, from the working directory `where`.
SAME_LINE = {
    "a missing recipe": (
        lambda: pretrain.check_early(pretrain.parse_args(["nosuchrecipe"])),
        lambda: load_config("nosuchrecipe"),
    ),
    "a folder for a recipe": (
        lambda: pretrain.check_early(pretrain.parse_args(["recipes"])),
        lambda: load_config("recipes"),
    ),
    "a misspelled key": (
        lambda: pretrain.check_early(pretrain.parse_args(["recipes/mine.yaml", "optim.lrr=0.1"])),
        lambda: load_config("recipes/mine.yaml", ["optim.lrr=0.1"]),
    ),
    "a misspelled key in the recipe": (
        lambda: pretrain.check_early(pretrain.parse_args(["quickstart", "train.epochs=2", "trian.epochs=2"])),
        lambda: load_config("quickstart", ["train.epochs=2", "trian.epochs=2"]),
    ),
    "a value of the wrong type": (
        lambda: pretrain.check_early(pretrain.parse_args(["quickstart", "train.epochs=many"])),
        lambda: load_config("quickstart", ["train.epochs=many"]),
    ),
    "an override without a value": (
        lambda: pretrain.check_early(pretrain.parse_args(["quickstart", "train.epochs"])),
        lambda: load_config("quickstart", ["train.epochs"]),
    ),
    "YAML that does not parse": (
        lambda: pretrain.check_early(pretrain.parse_args(["broken.yaml"])),
        lambda: load_config("broken.yaml"),
    ),
    "a missing target to evaluate": (
        lambda: evaluate.check_early(evaluate.parse_args(["runs/nowhere/"])),
        lambda: plan_evaluation("runs/nowhere/"),
    ),
    "a missing run to export": (
        lambda: export.check_early(export.parse_args(["nowhere"])),
        lambda: export.export(Path("nowhere"), "safetensors"),
    ),
    "a missing source to embed": (
        lambda: embed.check_early(embed.parse_args(["nowhere"])),
        lambda: source_kind(Path("nowhere")),
    ),
    "a misspelled key of one recipe compared": (
        lambda: compare.check_early(
            compare.parse_args(["quickstart", "recipes/mine.yaml", "optim.lrr=1", "--minutes", "1"])
        ),  # fmt: skip
        lambda: plan_comparison(["quickstart", "recipes/mine.yaml"], 1, overrides=["optim.lrr=1"]),
    ),
    "no job at once": (
        lambda: ablate.check_early(ablate.parse_args(["quickstart", "--seeds", "2", "--jobs", "0"])),
        lambda: LocalExecutor(0),
    ),
    "a fraction of 1 or more": (
        lambda: duplicates.check_early(duplicates.parse_args(["emb", "--fraction", "1.5"])),
        lambda: check_fraction(1.5),
    ),
    "a threshold above 1": (
        lambda: duplicates.check_early(duplicates.parse_args(["emb", "--threshold", "1.5"])),
        lambda: check_threshold(1.5),
    ),
    "a misspelled strategy": (
        lambda: label_selection.check_early(
            label_selection.parse_args(["emb", "--budget", "5", "--strategy", "badge"])
        ),
        lambda: select_to_file("emb", 5, "badge"),
    ),
    "a missing labelled file": (
        lambda: label_selection.check_early(
            label_selection.parse_args(["emb", "--budget", "5", "--strategy", "kmeans", "--labelled", "none.json"])
        ),
        lambda: select_to_file("emb", 5, "kmeans", "none.json"),
    ),
}


@pytest.mark.parametrize("mistake", SAME_LINE)
def test_the_early_line_is_the_librarys(where, monkeypatch, mistake):
    monkeypatch.chdir(where)
    early, library = SAME_LINE[mistake]
    assert line_of(early) == line_of(library)


@pytest.mark.parametrize("folder", ["nowhere", "partial", "unfinished", "emb/embeddings.npy"])
def test_an_embeddings_folder_is_refused_early_in_the_words_of_read_embeddings(where, monkeypatch, folder):
    monkeypatch.chdir(where)
    assert line_of(lambda: embeddings_folder(folder)) == line_of(lambda: read_embeddings(folder))


def test_a_finished_embeddings_folder_passes_and_its_files_are_the_stores(where):
    embeddings_folder(where / "emb")
    assert EMBEDDINGS_FILES == (embeddings_store.VECTORS_FILE, embeddings_store.ITEMS_FILE, embeddings_store.META_FILE)


def test_the_report_tells_a_run_as_the_library_does(where):
    for path in (where / "runs", where / "runs" / "runs" / "a", where / "nowhere", where / "emb"):
        assert is_run_dir(path) == library_is_run_dir(path), path
    assert report.main([str(where / "runs" / "runs" / "a"), str(where / "nowhere")]) == 2  # the run is reported
    assert (where / "runs" / "runs" / "a" / "report.md").is_file()
