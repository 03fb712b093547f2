"""channels_last against the default (NCHW) memory format, where sslkit runs a convolutional network.

    python tools/bench/memory_format.py [--recipe fashion_mnist_simclr] [--images 4096] [--repeats 3]

Three places, each timed in both memory formats, in fp32 and under bf16 autocast, on 1 and 2 threads:

- ``embed``: ``sslkit-embed``'s own encoding loop (:func:`sslkit.embeddings.extract.encode_chunks`) over
  ``--images`` Fashion-MNIST test images with the recipe's network and evaluation transform;
- ``features``: the evaluators' feature extraction (:func:`sslkit.evaluation.features.extract_features`,
  what kNN, the linear probe and retrieval read) over the same images;
- ``train step``: forward, backward and the optimizer step of the recipe's method on one batch of two
  views (``train.batch_size`` images), the compute of a training step without data loading.

channels_last here means the network's weights in that format (``module.to(memory_format=...)``); the
convolutions then run in it whatever the input's format, and the input is converted once by the first.
Each pair of measurements alternates formats ``--repeats`` times and keeps the best, so that load on a
shared machine hits both alike; the table gives the speed-up (default time / channels_last time) and
the largest difference between the two formats' outputs (features, or the loss after the step).
The weights are the recipe's random initialisation: speed does not depend on their values.
"""

from __future__ import annotations

import argparse
import copy
import platform
import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__" and __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from sslkit import models  # noqa: E402
from sslkit.augment.views import EvalTransform  # noqa: E402
from sslkit.config import load_config  # noqa: E402
from sslkit.datasets import collate_batch  # noqa: E402
from sslkit.embeddings.encoders import Encoder, Transform  # noqa: E402
from sslkit.embeddings.extract import encode_chunks  # noqa: E402
from sslkit.embeddings.images import images_to_embed  # noqa: E402
from sslkit.evaluation.features import extract_features  # noqa: E402
from sslkit.methods import build_method  # noqa: E402

FORMATS = {"default": torch.contiguous_format, "channels_last": torch.channels_last}


def cpu_model() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def autocast(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


def embed_once(network, transform, images, count: int, batch: int, precision: str, memory_format):
    encoder = Encoder(network, transform, description="", layer="backbone", kind="backbone file", run_dir=None)
    chunks = encode_chunks(
        encoder, images, [range(count)], batch, True, torch.device("cpu"), memory_format=memory_format
    )
    with autocast(precision):
        return torch.cat(list(chunks))


def features_once(network, transform, images, count: int, batch: int, precision: str):
    batches = [list(range(start, min(start + batch, count))) for start in range(0, count, batch)]
    loader = DataLoader(images.dataset, batch_sampler=batches, collate_fn=collate_batch)
    preprocess = transform.module()
    with autocast(precision):
        return extract_features(network, loader, preprocess)[0]


def train_step_once(method, optimizer, views, precision: str):
    with autocast(precision):
        loss = method(*views)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach().float().reshape(1)


def best_times(run_in, repeats: int) -> tuple[dict[str, float], float]:
    """The best of ``repeats`` timings of ``run_in(fmt)`` for each format, alternating; and the outputs' gap."""
    best, outputs = {name: float("inf") for name in FORMATS}, {}
    for _ in range(repeats):
        for name in FORMATS:
            start = time.perf_counter()
            outputs[name] = run_in(name)
            best[name] = min(best[name], time.perf_counter() - start)
    gap = (outputs["default"].float() - outputs["channels_last"].float()).abs().max().item()
    return best, gap


def measure(cfg, images, count: int, repeats: int, precision: str) -> list[tuple[str, dict, float]]:
    info = images.info
    network = models.backbone_from_config(cfg.model, info.channels).eval()
    networks = {name: copy.deepcopy(network).to(memory_format=fmt) for name, fmt in FORMATS.items()}
    transform = Transform(cfg.augment.image_size, info.channels, info.mean, info.std, cfg.augment.normalize)
    batch = cfg.eval.batch_size
    rows = [
        (
            "embed",
            *best_times(
                lambda f: embed_once(networks[f], transform, images, count, batch, precision, FORMATS[f]), repeats
            ),
        ),
        (
            "features",
            *best_times(lambda f: features_once(networks[f], transform, images, count, batch, precision), repeats),
        ),
    ]
    torch.manual_seed(0)
    method = build_method(cfg, models.backbone_from_config(cfg.model, info.channels), num_classes=info.num_classes)
    methods = {name: copy.deepcopy(method).to(memory_format=fmt).train() for name, fmt in FORMATS.items()}
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=1e-3) for name, m in methods.items()}
    size = cfg.augment.image_size
    evaluation = EvalTransform(size, info.channels, info.mean, info.std, cfg.augment.normalize)
    pixels, _ = images.dataset.__getitems__(list(range(cfg.train.batch_size)))
    first = evaluation(pixels)
    views = (first, first.flip(-1))
    start = copy.deepcopy(method.state_dict())  # every step starts from these weights: the losses compare

    def step(name):
        methods[name].load_state_dict(start)
        return train_step_once(methods[name], optimizers[name], views, precision)

    for name in FORMATS:  # oneDNN builds its kernels on the first calls
        step(name)
    rows.append(("train step", *best_times(step, repeats)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="fashion_mnist_simclr")
    parser.add_argument("--images", type=int, default=4096, help="test images encoded per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", default="1,2", help="torch thread counts, comma-separated")
    args = parser.parse_args(argv)

    cfg = load_config(args.recipe, ["model.channels_last=false"])
    images = images_to_embed(cfg, cfg.data.name, "test")
    count = min(args.images, len(images))
    table = Table(title=f"channels_last / default: {args.recipe}, {count} images, {cpu_model()}")
    for column in ("place", "threads", "precision", "default s", "channels_last s", "speed-up", "max |diff|"):
        table.add_column(column, justify="left" if column in ("place", "precision") else "right")
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for precision in ("fp32", "bf16"):
            for place, times, gap in measure(cfg, images, count, args.repeats, precision):
                speedup = times["default"] / times["channels_last"]
                table.add_row(
                    place, str(threads), precision, f"{times['default']:.3f}", f"{times['channels_last']:.3f}",
                    f"{speedup:.2f}x", f"{gap:.1e}",
                )  # fmt: skip
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
