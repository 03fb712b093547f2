"""Time and peak memory of the retrieval metrics, blockwise against the full similarity matrix.

Leave-one-out retrieval among N clustered features (one Gaussian cluster per class, noise 4 as
in ``knn.py``, so neighbours overlap across classes). Every implementation computes Recall@1,
R-Precision and MAP@R of the same features:

- ``sslkit``: :func:`sslkit.evaluation.retrieval_metrics`, one (1024, N) similarity block at a time;
- ``full matrix``: the same function with one block of N queries, i.e. the whole (N, N) matrix
  and its top R at once: the naive computation, with sslkit's arithmetic;
- ``pml``: pytorch-metric-learning's ``AccuracyCalculator`` (precision_at_1, r_precision,
  mean_average_precision_at_r) with ``CustomKNN(CosineSimilarity())``, a full-matrix kNN (its
  default kNN is faiss', and faiss is not installed here); ``pml batched`` gives that kNN
  ``batch_size=1024``.

NMI is timed on its own (``NMI (k-means)``: scikit-learn's k-means as ``retrieval_metrics`` runs
it, then the score): it costs the same whichever kNN runs, and pytorch-metric-learning's
default k-means is faiss' too.

Each measurement runs in a fresh process: wall time of the call, and peak memory as the
process's peak RSS less its RSS once the features exist (torch's CPU allocations are not seen by
``tracemalloc``). The full matrix needs N^2 x 4 bytes for the similarities alone (14.4 GB at
60,000) plus N x R for its top R; it runs only up to ``--full-max`` queries, and pytorch-metric-
learning, which holds a few (N, R) tensors (labels as float, float64 precisions), up to
``--pml-max-cells`` N x R.

    python tools/bench/retrieval.py --quick
    python tools/bench/retrieval.py --out retrieval_bench.json   # 60,000 x 128, 10 and 100 classes
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

import torch
from rich.console import Console
from rich.table import Table

FULL = {"n": [60_000], "small_n": [10_000, 20_000], "dim": 128, "classes": [10, 100]}
QUICK = {"n": [4_000], "small_n": [2_000], "dim": 32, "classes": [10]}
IMPLEMENTATIONS = ("sslkit", "full matrix", "pml", "pml batched", "NMI (k-means)")
CHUNK = 1024


def clustered_features(n: int, dim: int, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Shape: returns features (n, dim) float32 and labels (n,) int64."""
    generator = torch.Generator().manual_seed(1)
    centers = torch.randn(num_classes, dim, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, num_classes, (n,), generator=generator)
    return centers[labels] + 4.0 * torch.randn(n, dim, generator=generator), labels


def rss_bytes() -> int:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def pml_metrics(features: torch.Tensor, labels: torch.Tensor, batch_size: int | None) -> dict[str, float]:
    from pytorch_metric_learning.distances import CosineSimilarity
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    from pytorch_metric_learning.utils.inference import CustomKNN

    calculator = AccuracyCalculator(
        include=("precision_at_1", "r_precision", "mean_average_precision_at_r"),
        k="max_bin_count",
        device=torch.device("cpu"),
        knn_func=CustomKNN(CosineSimilarity(), batch_size=batch_size),
    )
    result = calculator.get_accuracy(features, labels)
    return {
        "recall@1": result["precision_at_1"],
        "r_precision": result["r_precision"],
        "map@r": result["mean_average_precision_at_r"],
    }


def measure(implementation: str, n: int, dim: int, num_classes: int) -> dict:
    """One measurement, in this process (the parent starts a fresh one for each)."""
    import pytorch_metric_learning.utils.accuracy_calculator  # noqa: F401  imports are not part of the time
    import sklearn.cluster  # noqa: F401
    import sklearn.metrics  # noqa: F401

    from sslkit.evaluation import retrieval_metrics
    from sslkit.evaluation.retrieval import _nmi

    features, labels = clustered_features(n, dim, num_classes)
    baseline = rss_bytes()
    start = time.perf_counter()
    if implementation == "sslkit":
        metrics = retrieval_metrics(features, labels, chunk_size=CHUNK, nmi=False)
    elif implementation == "full matrix":
        metrics = retrieval_metrics(features, labels, chunk_size=n, nmi=False)
    elif implementation in ("pml", "pml batched"):
        metrics = pml_metrics(features, labels, CHUNK if implementation == "pml batched" else None)
    else:
        # NMI: the k-means of retrieval_metrics, then the score (pml's NMI is the same sklearn score on
        # faiss' k-means, not installed here).
        metrics = {"nmi": _nmi(torch.nn.functional.normalize(features, dim=1), labels, seed=0)}
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    return {"seconds": seconds, "peak_mib": (peak - baseline) / 2**20, "metrics": metrics}


def measure_in_fresh_process(implementation: str, n: int, dim: int, num_classes: int) -> dict:
    spec = json.dumps({"implementation": implementation, "n": n, "dim": dim, "num_classes": num_classes})
    command = [sys.executable, __file__, "--measure", spec, "--threads", str(torch.get_num_threads())]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["exit status %d" % done.returncode])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def largest_class(n: int, dim: int, num_classes: int) -> int:
    return int(torch.bincount(clustered_features(n, dim, num_classes)[1]).max())


def run(sizes: dict, full_max: int, pml_max_cells: int, console: Console) -> list[dict]:
    rows = []
    for num_classes in sizes["classes"]:
        for n in sorted(set(sizes["small_n"] + sizes["n"])):
            depth = largest_class(n, sizes["dim"], num_classes) - 1  # the largest R
            for implementation in IMPLEMENTATIONS:
                skip = None
                if implementation in ("full matrix", "pml") and n > full_max:
                    skip = f"N > --full-max {full_max}: {n * n * 4 / 1e9:.1f} GB for the similarities alone"
                if implementation.startswith("pml") and n * depth > pml_max_cells:
                    skip = f"N x R = {n * depth:.2g} > --pml-max-cells {pml_max_cells:.2g}"
                if implementation == "NMI (k-means)" and n not in sizes["n"]:
                    skip = "timed at the largest N only"
                row = {"implementation": implementation, "n": n, "dim": sizes["dim"], "classes": num_classes}
                row["largest_r"] = depth
                if skip:
                    row["skipped"] = skip
                else:
                    row.update(measure_in_fresh_process(implementation, n, sizes["dim"], num_classes))
                console.print(row)
                rows.append(row)
    return rows


def render(rows: list[dict], console: Console) -> None:
    table = Table(title="Retrieval metrics, leave-one-out: wall time and peak memory (RSS above the features)")
    columns = ("N x D", "classes", "largest R", "implementation", "seconds", "peak MiB", "Recall@1", "MAP@R", "NMI")
    for column in columns:
        table.add_column(column, justify="left" if column == "implementation" else "right")
    for row in rows:
        if "skipped" in row:
            continue
        if "error" in row:
            cells = [f"error: {row['error']}", "-", "-", "-", "-"]
        else:
            metrics = row["metrics"]
            cells = [f"{row['seconds']:.1f}", f"{row['peak_mib']:.0f}"]
            cells += [f"{metrics[key]:.4f}" if key in metrics else "-" for key in ("recall@1", "map@r", "nmi")]
        size = f"{row['n']:,} x {row['dim']}"
        table.add_row(size, str(row["classes"]), str(row["largest_r"]), row["implementation"], *cells)
    console.print(table)
    for row in rows:
        if "skipped" in row:
            what = f"{row['implementation']}, N = {row['n']:,}, {row['classes']} classes"
            console.print(f"not measured: {what}: {row['skipped']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"small sizes: {QUICK}")
    parser.add_argument("--n", type=int, nargs="+", help=f"queries for every implementation (default {FULL['n']})")
    parser.add_argument("--small-n", type=int, nargs="+", help=f"smaller N also measured (default {FULL['small_n']})")
    parser.add_argument("--classes", type=int, nargs="+", help=f"class counts (default {FULL['classes']})")
    parser.add_argument("--full-max", type=int, default=20_000, help="largest N for the full matrix")
    parser.add_argument("--pml-max-cells", type=float, default=5e7, help="largest N x R for pytorch-metric-learning")
    parser.add_argument("--threads", type=int, help="torch threads (default: every core)")
    parser.add_argument("--out", help="write the figures as JSON here")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: one measurement, as JSON
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.measure:
        print(json.dumps(measure(**json.loads(args.measure))))
        return

    sizes = dict(QUICK if args.quick else FULL)
    sizes.update({key: getattr(args, key) for key in ("n", "small_n", "classes") if getattr(args, key)})
    console = Console(width=140)
    load_before = os.getloadavg()[0]
    rows = run(sizes, args.full_max, args.pml_max_cells, console)
    render(rows, console)
    machine = {
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "python": platform.python_version(), "load_average_1min": [load_before, os.getloadavg()[0]],
    }  # fmt: skip
    console.print(f"torch threads {machine['torch_threads']}, load average (1 min) before / after {load_before:.1f}"
                  f" / {machine['load_average_1min'][1]:.1f}")  # fmt: skip
    if args.out:
        with open(args.out, "w") as file:
            json.dump({"rows": rows, "machine": machine}, file, indent=2)
        console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
