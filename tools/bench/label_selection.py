"""Which images to label: a linear classifier trained on each strategy's picks, at a few budgets and seeds.

For every strategy of :mod:`sslkit.selection`, budget and seed, ``select`` picks that many of the
training images from the encoder's embeddings, a scikit-learn ``LogisticRegression`` (defaults,
``max_iter=2000``) learns their classes from their L2-normalised features, and its top-1 accuracy
on the whole test split is reported (mean and spread over the seeds), with the number of classes
the picks hold and the seconds the choice took.

The embeddings of the run's training and test splits are computed once (the backbone's features,
as ``sslkit-evaluate`` extracts them) and kept as embeddings folders in ``--work``; ``--train`` and
``--test`` take folders written before (``sslkit-embed``'s).

    python tools/bench/label_selection.py --run runs/fashion-mnist-simclr --work /tmp/select-bench --out select.json
    python tools/bench/label_selection.py --run runs/quickstart --budgets 10,30 --seeds 0 --strategies random,kcenter

The greedy strategies (ProbCover, k-center) choose the same first n images whatever the budget once
their start is fixed, so they are run once per seed at the largest budget and cut; ProbCover's
delta is chosen by purity once per seed.
"""

from __future__ import annotations

import os
import sys

# This file's name is the standard library's ``select``, which subprocess (imported by torch) needs: the
# script's own folder leaves the path before anything imports it.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from sslkit.augment import EvalTransform
from sslkit.datasets import build_dataset
from sslkit.embeddings import read_embeddings, write_embeddings
from sslkit.evaluation import eval_loader, extract_features
from sslkit.evaluation.encoder import load_trained_backbone
from sslkit.evaluation.search import unit_vectors
from sslkit.selection import STRATEGIES, choose
from sslkit.selection.probcover import choose_delta

PREFIX_CONSISTENT = ("probcover", "kcenter")


def embeddings_of(run: Path, split: str, work: Path) -> Path:
    """The run backbone's features of every image of ``split``, as an embeddings folder in ``work`` (cached)."""
    folder = work / f"embeddings-{split}"
    if (folder / "meta.json").is_file():
        return folder
    cfg, _, backbone = load_trained_backbone(run)
    dataset = build_dataset(cfg.data.name, split, cfg.data.root, cfg.data.download, cfg.data.image_size)
    info = dataset.info
    preprocess = EvalTransform(cfg.augment.image_size, info.channels, info.mean, info.std, cfg.augment.normalize)
    features, labels = extract_features(backbone, eval_loader(dataset, cfg.eval.batch_size), preprocess)
    items = [str(i) for i in range(len(dataset))]
    meta = {"data": {"name": cfg.data.name, "split": split}, "source": str(run.resolve()), "layer": "backbone"}
    return write_embeddings(folder, features.numpy(), items, labels.numpy(), meta)


def probe_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray) -> float:
    """Top-1 of a logistic regression on L2-normalised features (one class alone: always that class)."""
    from sklearn.linear_model import LogisticRegression

    if len(np.unique(train_y)) == 1:
        return float((test_y == train_y[0]).mean())
    model = LogisticRegression(max_iter=2000).fit(train_x, train_y)
    return float((model.predict(test_x) == test_y).mean())


def picks_for(vectors, strategy: str, budgets: list[int], seed: int, classes: int) -> dict[int, tuple]:
    """``budget -> (rows, seconds, details)`` for one strategy and seed."""
    out = {}
    if strategy in PREFIX_CONSISTENT:
        options, measured = {}, {}
        start = time.perf_counter()
        if strategy == "probcover":
            delta, purity = choose_delta(unit_vectors(vectors), classes, seed)
            options, measured = {"delta": delta}, {"purity": purity, "classes": classes}
        chosen = choose(vectors, max(budgets), strategy, seed=seed, **options)
        seconds = time.perf_counter() - start
        return {b: (chosen.rows[:b], seconds, {**chosen.details, **measured}) for b in budgets}
    for budget in budgets:
        start = time.perf_counter()
        chosen = choose(vectors, budget, strategy, seed=seed)
        out[budget] = (chosen.rows, time.perf_counter() - start, chosen.details)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a run directory whose backbone embeds the images")
    parser.add_argument("--work", type=Path, default=Path("select-bench"), help="where the embeddings are kept")
    parser.add_argument("--train", type=Path, help="an embeddings folder of the training split (instead of --run)")
    parser.add_argument("--test", type=Path, help="an embeddings folder of the test split (instead of --run)")
    parser.add_argument("--budgets", default="20,100,600")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--out", type=Path, help="write the results as JSON")
    args = parser.parse_args()
    torch.manual_seed(0)
    train = read_embeddings(args.train or embeddings_of(args.run, "train", args.work))
    test = read_embeddings(args.test or embeddings_of(args.run, "test", args.work))
    train_x, test_x = unit_vectors(train.vectors).numpy(), unit_vectors(test.vectors).numpy()
    budgets = [int(b) for b in args.budgets.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    classes = len(np.unique(train.labels))
    rows = []
    for strategy in args.strategies.split(","):
        for seed in seeds:
            for budget, (picks, seconds, details) in picks_for(
                train.vectors, strategy, budgets, seed, classes
            ).items():
                accuracy = probe_accuracy(train_x[picks], train.labels[picks], test_x, test.labels)
                found = len(np.unique(train.labels[picks]))
                rows.append(
                    {"strategy": strategy, "budget": budget, "seed": seed, "accuracy": accuracy,
                     "classes": found, "seconds": seconds, "details": details}
                )  # fmt: skip
                print(
                    f"{strategy:10s} budget {budget:4d} seed {seed}: {accuracy:.3f} ({found} classes, {seconds:.1f} s)"
                )
    table = Table(title=f"logistic regression on the picks: test top-1, mean ± std over seeds {args.seeds}")
    table.add_column("strategy")
    for budget in budgets:
        table.add_column(f"{budget} labels", justify="right")
    for strategy in dict.fromkeys(row["strategy"] for row in rows):
        cells = []
        for budget in budgets:
            values = [r["accuracy"] for r in rows if r["strategy"] == strategy and r["budget"] == budget]
            cells.append(f"{np.mean(values):.3f} ± {np.std(values):.3f}")
        table.add_row(strategy, *cells)
    Console().print(table)
    if args.out:
        meta = {"train": str(train.folder), "test": str(test.folder), "budgets": budgets, "seeds": seeds}
        args.out.write_text(json.dumps({**meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
