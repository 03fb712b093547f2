"""How close the margin heads are to the fastest exact loss that PyTorch's own kernels can make.

``losses.py`` measures each head against three bare (B x D) @ (D x C) matmuls. Those are not
all a head must do: any exact cosine-softmax loss also reads the (C, D) weights for their norms,
scales by ``1/||W_j||`` once, takes one ``exp`` of the (B, C) logits and their row sums, and
removes the radial part of the weight gradient, one more pass over two (C, D) arrays. At
B = 512, D = 512, C = 10,000 each of those arrays is 20 MiB, which a matmul of that size has
pushed out of cache, so each pass costs about a millisecond, more for a read and a write.
The *aten floor* here is exactly that: the three matmuls plus those five passes, each one
PyTorch kernel on preallocated buffers, and nothing else (no target margin, no feature
normalisation, no Python between them). A head built from PyTorch ops cannot be faster than
it; ``head / aten floor`` is what the head's own code costs over it.

Candidates run interleaved in a new random order each repeat; a figure is the median over
repeats of the ratio of two candidates' times in the same repeat (as in ``losses.py``), and
the run is repeated ``--rounds`` times to show how far the machine's noise moves it.

Usage::

    python tools/bench/head_floor.py                      # about 2 minutes on 2 cores
    python tools/bench/head_floor.py --rounds 5 --out runs/bench/head_floor.json
    python tools/bench/head_floor.py --quick              # tiny sizes (smoke test)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Callable

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from losses import HEADS, build_sslkit, make_matmul_step, make_step, median_times  # noqa: E402

FULL = {"batch": 512, "dim": 512, "classes": 10_000, "repeats": 30}
QUICK = {"batch": 32, "dim": 16, "classes": 100, "repeats": 3}
FLOOR_HEADS = ("arcface", "cosface", "sphereface")


def make_aten_floor_step(batch: int, dim: int, classes: int) -> Callable[[], float]:
    """The three matmuls and the five memory passes every exact cosine-softmax loss makes.

    forward: ``||W_j||`` (C, D) read; ``L = F W^T`` (matmul); ``L *= 1/||W_j||``, ``exp``, row
    sums (three (B, C) passes); backward: ``E W`` and ``E^T F`` (matmuls); the radial part of
    the weight gradient (aten's fused weight-norm backward: two (C, D) reads, one write).
    """
    g = torch.Generator().manual_seed(2)
    features = torch.nn.functional.normalize(torch.randn(batch, dim, generator=g), dim=1) * 64
    weight = torch.randn(classes, dim, generator=g) * 0.05
    logits, product = torch.empty(batch, classes), torch.empty(classes, dim)
    gain = torch.ones(classes, 1)

    def step() -> float:
        norm = torch.linalg.vector_norm(weight, dim=1)
        torch.mm(features, weight.T, out=logits)
        logits.mul_(norm.reciprocal()).exp_()
        logits.sum(dim=1)
        logits @ weight
        torch.mm(logits.T, features, out=product)
        torch.ops.aten._weight_norm_interface_backward(product, weight, gain, norm.unsqueeze(1), 0)
        return 0.0

    return step


def measure(config: dict, rounds: int) -> list[dict]:
    batch, dim, classes = config["batch"], config["dim"], config["classes"]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, dim, generator=g)
    labels = torch.randint(0, classes, (batch,), generator=g)
    steps = {"matmul3": make_matmul_step(batch, dim, classes), "aten floor": make_aten_floor_step(batch, dim, classes)}
    for name, *_ in HEADS:
        if name in FLOOR_HEADS:
            steps[name] = make_step(build_sslkit(name, dim, classes), "head", x, labels)
    results = []
    for _ in range(rounds):
        times, _, errors = median_times(dict(steps), config["repeats"])
        if errors:
            raise RuntimeError(f"a candidate failed: {errors}")
        results.append(
            {
                "raw_median_ms": {k: 1e3 * v for k, v in times.items()},
                "over_matmul3": {k: times.ratio(k, "matmul3") for k in steps if k != "matmul3"},
                "over_floor": {k: times.ratio(k, "aten floor") for k in FLOOR_HEADS if k in steps},
            }
        )
    return results


def summary_table(results: list[dict], config: dict) -> Table:
    table = Table(
        title=f"heads against the aten floor, B={config['batch']}, D={config['dim']}, C={config['classes']:,}: "
        f"median [min-max] over {len(results)} rounds of {config['repeats']} interleaved repeats"
    )
    for col in ("candidate", "x / 3 matmuls", "x / aten floor"):
        table.add_column(col, justify="left" if col == "candidate" else "right")

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.3f}x [{min(values):.3f}-{max(values):.3f}]"

    for name in results[0]["over_matmul3"]:
        floor = [r["over_floor"][name] for r in results] if name in results[0]["over_floor"] else None
        table.add_row(name, cell([r["over_matmul3"][name] for r in results]), cell(floor) if floor else "-")
    return table


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="independent rounds (the spread shows the noise)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, seconds: only shows that it runs")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = QUICK if args.quick else FULL
    results = measure(config, args.rounds)
    Console().print(summary_table(results, config))
    report = {"config": {**config, "threads": args.threads, "torch": torch.__version__}, "rounds": results}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
