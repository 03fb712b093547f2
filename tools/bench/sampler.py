"""What a class-balanced batch buys on a dataset of Stanford Online Products' shape: positives per anchor.

A set of SOP's shape is generated (labels only): 11,318 classes of 2 to 12 images, about 5.3 each
(SOP's training half: 59,551 images of 11,318 classes). One epoch of batches of 256 is drawn by

- ``random``: :class:`sslkit.datasets.EpochShuffleSampler`, the default ``data.sampler``;
- ``m_per_class m=K``: :class:`sslkit.datasets.MPerClassSampler`, ``256 / K`` classes of ``K`` images;

and for each, over every anchor of every batch: the positives it has in its batch (other images of
its class), the share of anchors with at least one (a pair-based loss learns nothing from the
others), the distinct classes per batch, and the epoch's coverage (the share of the images used
at least once, the draws per image, and the most uses of one image). Drawing the order is timed too.

    python tools/bench/sampler.py --quick
    python tools/bench/sampler.py --out sampler_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch
from rich.console import Console
from rich.table import Table

from sslkit.datasets import EpochShuffleSampler, MPerClassSampler

FULL = {"classes": 11_318}
QUICK = {"classes": 1_000}


def sop_shaped_labels(classes: int, seed: int) -> torch.Tensor:
    """Labels of ``classes`` classes of 2 + Binomial(10, 0.33) images each (2 to 12, mean 5.3), shuffled."""
    generator = torch.Generator().manual_seed(seed)
    sizes = 2 + torch.binomial(torch.full((classes,), 10.0), torch.full((classes,), 0.33), generator=generator)
    labels = torch.repeat_interleave(torch.arange(classes), sizes.long())
    return labels[torch.randperm(len(labels), generator=generator)]


def measure(sampler, labels: torch.Tensor, batch_size: int) -> dict:
    """Positives per anchor, classes per batch and coverage over one epoch of ``sampler``."""
    start = time.perf_counter()
    order = torch.tensor(list(sampler))
    seconds = time.perf_counter() - start
    batches = order[: len(order) // batch_size * batch_size].view(-1, batch_size)
    batch_labels = labels[batches]  # (B, batch)
    same = batch_labels[:, :, None] == batch_labels[:, None, :]  # (B, batch, batch)
    positives = same.sum(-1) - 1  # each anchor's other images of its class in its batch
    uses = torch.bincount(batches.flatten(), minlength=len(labels))
    return {
        "batches": len(batches),
        "images_per_epoch": batches.numel(),
        "positives_per_anchor": positives.double().mean().item(),
        "anchors_with_a_positive": (positives > 0).double().mean().item(),
        "classes_per_batch": sum(len(torch.unique(row)) for row in batch_labels) / len(batch_labels),
        "draws_per_image": batches.numel() / len(labels),
        "coverage": (uses > 0).double().mean().item(),
        "most_uses": int(uses.max()),
        "order_seconds": seconds,
    }


def run(classes: int, batch_size: int, ms: list[int], seed: int) -> dict:
    labels = sop_shaped_labels(classes, seed)
    rows = {"random": measure(EpochShuffleSampler(len(labels), seed), labels, batch_size)}
    for m in ms:
        rows[f"m_per_class, m={m}"] = measure(MPerClassSampler(labels, m, batch_size, seed), labels, batch_size)
    counts = torch.bincount(labels)
    dataset = {"images": len(labels), "classes": classes, "mean_class_size": counts.double().mean().item()}
    return {"dataset": dataset, "batch_size": batch_size, "seed": seed, "samplers": rows}


def render(result: dict, console: Console) -> None:
    d = result["dataset"]
    table = Table(
        title=f"one epoch, batches of {result['batch_size']}, SOP-shaped labels: {d['images']:,} images, "
        f"{d['classes']:,} classes ({d['mean_class_size']:.2f} images each), seed {result['seed']}"
    )
    for column in ("sampler", "positives / anchor", "anchors with a positive", "classes / batch", "batches"):
        table.add_column(column, justify="right")
    for column in ("draws / image", "images used", "most uses of one", "order (s)"):
        table.add_column(column, justify="right")
    for name, r in result["samplers"].items():
        table.add_row(
            name,
            f"{r['positives_per_anchor']:.3f}",
            f"{r['anchors_with_a_positive']:.1%}",
            f"{r['classes_per_batch']:.1f}",
            str(r["batches"]),
            f"{r['draws_per_image']:.2f}",
            f"{r['coverage']:.1%}",
            str(r["most_uses"]),
            f"{r['order_seconds']:.2f}",
        )
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"fewer classes: {QUICK['classes']}")
    parser.add_argument("--classes", type=int, help=f"classes (default {FULL['classes']})")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--m", type=int, nargs="+", default=[2, 4, 8], help="images per class of m_per_class")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()

    classes = args.classes or (QUICK if args.quick else FULL)["classes"]
    result = run(classes, args.batch, args.m, args.seed)
    result["machine"] = {
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "python": platform.python_version(), "processor": platform.processor(),
        "load_average_1min": os.getloadavg()[0],
    }  # fmt: skip
    console = Console(width=max(150, Console().width))
    render(result, console)
    if args.out:
        with open(args.out, "w") as file:
            json.dump(result, file, indent=2)
        console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
