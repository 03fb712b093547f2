"""Time sslkit's weighted kNN against scikit-learn's brute-force cosine KNeighborsClassifier.

Both classify the same test features from the same train features with k = 200:

- ``sslkit``: :func:`sslkit.evaluation.weighted_knn_predict` (InstDisc votes, T = 0.07);
- ``sklearn``: ``KNeighborsClassifier(n_neighbors=200, metric="cosine", algorithm="brute")``
  with its default uniform votes;
- ``sklearn-instdisc`` (``--with-weights``): the same with the InstDisc weight
  ``exp((1 - d) / T)``, which predicts what sslkit predicts (the agreement is reported).

Features are Gaussian clusters, one per class, so the neighbours mean something. Times are
the best of ``--repeats`` runs of ``predict`` alone (``fit`` only stores the data).

    python tools/bench/knn.py --quick
    python tools/bench/knn.py --out knn_bench.json   # 60k x 128 train, 10k test
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from sklearn.neighbors import KNeighborsClassifier

from sslkit.evaluation import weighted_knn_predict

FULL = {"train": 60_000, "test": 10_000, "dim": 128}
QUICK = {"train": 5_000, "test": 1_000, "dim": 128}


def clustered_features(
    n: int, dim: int, num_classes: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shape: returns features (n, dim) float32 and labels (n,) int64."""
    centers = torch.randn(num_classes, dim, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, num_classes, (n,), generator=generator)
    # Noise 4: classes overlap (kNN accuracy about 0.85), so the votes decide predictions.
    return centers[labels] + 4.0 * torch.randn(n, dim, generator=generator), labels


def best_time(fn, repeats: int):
    """Smallest wall time over ``repeats`` calls, and the last result."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def run(
    train: int, test: int, dim: int, num_classes: int, k: int, temperature: float, repeats: int, with_weights: bool
) -> dict:
    generator = torch.Generator().manual_seed(1)
    train_x, train_y = clustered_features(train, dim, num_classes, generator)
    test_x, test_y = clustered_features(test, dim, num_classes, generator)

    ours_s, ours = best_time(
        lambda: weighted_knn_predict(train_x, train_y, test_x, num_classes, k, temperature), repeats
    )
    sklearn_knn = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute").fit(
        train_x.numpy(), train_y.numpy()
    )
    sklearn_s, uniform = best_time(lambda: sklearn_knn.predict(test_x.numpy()), repeats)

    result = {
        "train": train, "test": test, "dim": dim, "classes": num_classes, "k": k, "temperature": temperature,
        "sslkit_s": ours_s, "sklearn_s": sklearn_s, "sklearn_over_sslkit": sklearn_s / ours_s,
        "sslkit_accuracy": (ours == test_y).double().mean().item(),
        "sklearn_accuracy": float((uniform == test_y.numpy()).mean()),
    }  # fmt: skip
    if with_weights:
        weighted_knn = KNeighborsClassifier(
            n_neighbors=k, metric="cosine", algorithm="brute", weights=lambda d: np.exp((1.0 - d) / temperature)
        ).fit(train_x.numpy(), train_y.numpy())
        weighted_s, weighted = best_time(lambda: weighted_knn.predict(test_x.numpy()), repeats)
        result["sklearn_instdisc_s"] = weighted_s
        result["sklearn_instdisc_over_sslkit"] = weighted_s / ours_s
        result["agreement_with_sklearn_instdisc"] = float((weighted == ours.numpy()).mean())
    return result


def render(result: dict, console: Console) -> None:
    table = Table(
        title=f"kNN predict, k={result['k']}: {result['train']} x {result['dim']} train, {result['test']} test",
        caption="sklearn: KNeighborsClassifier(metric='cosine', algorithm='brute')",
    )
    for column in ("implementation", "seconds", "sklearn / sslkit", "accuracy"):
        table.add_column(column, justify="right" if column != "implementation" else "left")
    table.add_row("sslkit", f"{result['sslkit_s']:.3f}", "1.0", f"{result['sslkit_accuracy']:.4f}")
    table.add_row(
        "sklearn",
        f"{result['sklearn_s']:.3f}",
        f"{result['sklearn_over_sslkit']:.1f}",
        f"{result['sklearn_accuracy']:.4f}",
    )
    if "sklearn_instdisc_s" in result:
        table.add_row(
            "sklearn, InstDisc weights",
            f"{result['sklearn_instdisc_s']:.3f}",
            f"{result['sklearn_instdisc_over_sslkit']:.1f}",
            f"agrees on {100 * result['agreement_with_sklearn_instdisc']:.2f}%",
        )
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"small sizes: {QUICK}")
    parser.add_argument("--train", type=int, help=f"train rows (default {FULL['train']})")
    parser.add_argument("--test", type=int, help=f"test rows (default {FULL['test']})")
    parser.add_argument("--dim", type=int, help=f"feature dimension (default {FULL['dim']})")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--k", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.07)
    parser.add_argument("--repeats", type=int, help="runs per implementation, best kept (default 3 quick, 1 full)")
    parser.add_argument(
        "--with-weights", action="store_true", help="also time sklearn with the InstDisc weight callable"
    )
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()

    sizes = dict(QUICK if args.quick else FULL)
    sizes.update({key: getattr(args, key) for key in sizes if getattr(args, key) is not None})
    repeats = args.repeats or (3 if args.quick else 1)
    result = run(
        **sizes,
        num_classes=args.classes,
        k=args.k,
        temperature=args.temperature,
        repeats=repeats,
        with_weights=args.with_weights,
    )
    result["machine"] = {
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "python": platform.python_version(), "load_average_1min": os.getloadavg()[0],
    }  # fmt: skip
    console = Console()
    render(result, console)
    console.print(
        f"torch threads {torch.get_num_threads()}, load average (1 min) {result['machine']['load_average_1min']:.1f}"
    )
    if args.out:
        with open(args.out, "w") as file:
            json.dump(result, file, indent=2)
        console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
