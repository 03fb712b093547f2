"""End-to-end race on Fashion-MNIST: sslkit's SimCLR against the same run built from lightly's pieces.

    python tools/bench/race.py [--epochs E] [--threads T] [--quick] [--out JSON]

Both sides train the same SimCLR for the same epochs and are scored by the same evaluator:

- ``sslkit``: ``python -m sslkit.cli.pretrain`` with the recipe in a subprocess, as a user runs it.
  Images/s and data wait come from the run's ``metrics.jsonl`` (logged every step here), the
  trained backbone from its ``backbone.safetensors``.
- ``lightly``: a plain PyTorch loop a lightly user would write. ``lightly.transforms.SimCLRTransform``
  makes both views per sample from PIL images in DataLoader workers, ``lightly.loss.NTXentLoss``
  is the loss. Everything else is sslkit's and identical: ``build_backbone`` (same width, stem,
  input channels), ``build_mlp`` projector, both views through the backbone in one batch
  (``sslkit.methods.SimCLR`` holding lightly's loss), parameter groups, optimizer, learning rate
  and its cosine schedule (``sslkit.optim``), batch, epochs, seed, ``torch.set_num_threads``.
  Images/s counts every training step of every epoch, waits on the loader included.

Then both backbones go through ``sslkit.evaluation.extract_features`` with
``sslkit.augment.EvalTransform`` and ``sslkit.evaluation.knn_accuracy`` (the recipe's k and T)
on the same train / test images.

Grey images: lightly's transform takes PIL images; given mode "L" images every step of this
recipe works on one channel (saturation, hue and grayscale are off), and ``ToTensor`` gives
(1, H, W). So both backbones take one input channel, and no RGB copy of the grey images is made.

lightly's data loader runs with 0 and with 2 workers on a short probe; the full race runs
with whichever was faster, and the JSON records both probe figures.

``--quick`` is a smoke run on scikit-learn's digits with a tiny model (seconds, figures
meaningless beyond "it runs end to end").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__" and __package__ in (None, ""):
    # Run as a script: the repository root first on the path. Not when a test imports this file
    # as a module, where sys.path[0] is the test process's own entry.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from sslkit.config import Config, EvalConfig, load_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PRETRAIN = "sslkit.cli.pretrain"
FASHION_RECIPE = ROOT / "recipes" / "fashion_mnist_simclr.yaml"
QUICKSTART = ROOT / "recipes" / "quickstart.yaml"
QUICKSTART_FASHION = ["data.name=fashion_mnist", "augment.image_size=28"]
QUICK_OVERRIDES = [
    "data.name=digits",
    "augment.image_size=16",
    "model.width=8",
    "model.projector_hidden=64",
    "model.projector_out=32",
    "train.batch_size=64",
    "eval.knn_k=20",
]
# What the sslkit run does besides training, trimmed (none of it changes the training itself): a
# log line every step (exact images/s and per-step waits), no online kNN, a one-epoch linear
# probe (not part of the race), no extra baselines. Checkpoints stay as the recipe says: they are
# written between epochs, outside the loop's timed windows.
SSLKIT_RUN_OVERRIDES = [
    "train.log_every_steps=1",
    "train.knn_every_epochs=0",
    "eval.linear_epochs=1",
    "eval.compare_random_init=false",
]
PROBE_STEPS, QUICK_PROBE_STEPS = 30, 3
DEFAULT_EPOCHS = 4
WORKER_CHOICES = (0, 2)


# --------------------------------------------------------------------------- recipe


# lightly's SimCLRTransform has no solarize, and its blur is PIL's on a kernel of its own choosing:
# the race turns both off on both sides so that the two loops see the same views.
NO_BLUR_OR_SOLARIZE = ("augment.blur_p=0.0", "augment.solarize_p=0.0")


def default_recipe() -> tuple[Path, list[str]]:
    """The Fashion-MNIST SimCLR recipe without blur and solarize, or the quick start pointed at
    Fashion-MNIST while it is missing."""
    if FASHION_RECIPE.is_file():
        return FASHION_RECIPE, list(NO_BLUR_OR_SOLARIZE)
    return QUICKSTART, list(QUICKSTART_FASHION)


def race_overrides(quick: bool, epochs: int | None, threads: int, extra: list[str]) -> list[str]:
    """Overrides both sides share: the quick sizes, epochs, threads, then the user's own."""
    overrides = list(QUICK_OVERRIDES) if quick else []
    if epochs is not None:
        overrides.append(f"train.epochs={epochs}")
    overrides.append(f"train.threads={threads}")
    return overrides + list(extra)


def check_raceable(cfg: Config) -> None:
    """Refuse recipes the lightly side cannot mirror, naming the key to change."""
    from sslkit.errors import UserError

    wrong = {
        "method.name": (cfg.method.name, "simclr"),
        "loss.name": (cfg.loss.name, "ntxent"),
        "train.mixed_precision": (cfg.train.mixed_precision, "no"),
        "train.grad_accum_steps": (cfg.train.grad_accum_steps, 1),
    }
    for key, (value, needed) in wrong.items():
        if value != needed:
            raise UserError(
                f"the race compares SimCLR + NT-Xent in fp32 without accumulation; {key} is {value!r}, use {needed!r}"
            )
    if (
        cfg.augment.blur_p > 0
        or cfg.augment.solarize_p > 0
        or cfg.augment.blur_p_view2
        or cfg.augment.solarize_p_view2
    ):
        raise UserError(
            "the race maps the recipe onto lightly's SimCLRTransform without blur or solarize; "
            "set augment.blur_p=0 and augment.solarize_p=0"
        )
    if cfg.data.name not in ("fashion_mnist", "digits"):
        raise UserError(f"the race runs on fashion_mnist (or digits for --quick), not {cfg.data.name}")


# --------------------------------------------------------------------------- sslkit


def read_sslkit_metrics(metrics_path: Path, batch_size: int, batches_per_epoch: int) -> dict:
    """Images/s and data wait of a run logged every step, from its ``metrics.jsonl``.

    With ``log_every_steps=1`` each record's window is one step, except the first record of an
    epoch: the loop restarts its window at each epoch start, so that window also holds the
    time to start the epoch's iterator (as lightly's epochs do here).
    """
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    steps = [r for r in records if "images_per_s" in r]
    if not steps:
        raise ValueError(f"{metrics_path} has no training records")
    seconds, waits, images = [], [], 0
    previous_step, previous_epoch = None, None
    for r in steps:
        first_of_epoch = r["epoch"] * batches_per_epoch
        start = previous_step if previous_epoch == r["epoch"] else first_of_epoch
        window_steps = r["step"] - start
        elapsed = window_steps * batch_size / r["images_per_s"]
        seconds.append(elapsed)
        waits.append(r["data_wait_share"] * elapsed / window_steps)  # mean wait per step of the window
        images += window_steps * batch_size
        previous_step, previous_epoch = r["step"], r["epoch"]
    total = sum(seconds)
    return {
        "images_per_s": images / total,
        "train_s": total,
        "steps": images // batch_size,
        "data_wait_share": sum(r["data_wait_share"] * s for r, s in zip(steps, seconds)) / total,
        "data_wait_median_s": statistics.median(waits),
        "data_wait_max_s": max(waits),
    }


def run_sslkit(
    recipe: Path, overrides: list[str], workdir: Path, batches_per_epoch: int, batch_size: int, timeout: float
) -> dict:
    """``python -m sslkit.cli.pretrain`` in a subprocess; images/s from its metrics, the backbone from its run
    directory."""
    run_overrides = [*overrides, *SSLKIT_RUN_OVERRIDES, f"run.output_dir={workdir}", "run.name=race-sslkit"]
    if "compare_raw_pixels" in {f.name for f in dataclasses.fields(EvalConfig)}:
        run_overrides.append("eval.compare_raw_pixels=false")
    command = [sys.executable, "-m", PRETRAIN, str(recipe), *run_overrides]
    shutil.rmtree(workdir / "race-sslkit", ignore_errors=True)  # the race's own scratch run: a rerun starts over
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    process = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=workdir)
    wall = time.perf_counter() - start
    if process.returncode != 0:
        tail = (process.stderr.strip() or process.stdout.strip()).splitlines()[-5:]
        raise RuntimeError(f"sslkit-pretrain exited with {process.returncode}: {' | '.join(tail)}")
    run_dir = workdir / "race-sslkit"
    figures = read_sslkit_metrics(run_dir / "metrics.jsonl", batch_size, batches_per_epoch)
    results = json.loads((run_dir / "results.json").read_text())["results"]["trained"]
    return {
        **figures,
        "wall_s": wall,
        "knn_top1_run_dir": results["knn_top1"],
        "backbone": str(run_dir / "backbone.safetensors"),
        "command": " ".join(command[1:]),
    }


# --------------------------------------------------------------------------- lightly


class PILDataset(torch.utils.data.Dataset):
    """Grey uint8 images as PIL "L" images through a per-sample transform, as lightly expects them.

    Shape:
        images: (N, 1, H, W) uint8; yields (transform(PIL image), label).
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform) -> None:
        self.images, self.labels, self.transform = images[:, 0].numpy(), labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        from PIL import Image

        return self.transform(Image.fromarray(self.images[index], mode="L")), self.labels[index]


def lightly_transform(cfg: Config, mean: tuple[float, ...], std: tuple[float, ...]):
    """lightly's SimCLRTransform with the recipe's augmentation values, as far as its arguments reach.

    Not reachable: the crop's upper scale (lightly fixes 1.0) and aspect ratios (torchvision's
    default 3/4..4/3, the recipe's default too); the differences are listed in the report.
    """
    from lightly.transforms import SimCLRTransform

    a = cfg.augment
    return SimCLRTransform(
        input_size=a.image_size,
        cj_prob=a.jitter_p,
        cj_strength=1.0,
        cj_bright=a.brightness,
        cj_contrast=a.contrast,
        cj_sat=a.saturation,
        cj_hue=a.hue,
        min_scale=a.crop_scale[0],
        random_gray_scale=a.grayscale_p,
        gaussian_blur=0.0,
        hf_prob=a.hflip_p,
        vf_prob=0.0,
        rr_prob=0.0,
        normalize={"mean": list(mean), "std": list(std)} if a.normalize else None,
    )


def augmentation_differences(cfg: Config) -> list[str]:
    a = cfg.augment
    notes = [
        "crop: sslkit samples the crop window bilinearly from the whole image (roi_align, antialiased); "
        "torchvision crops then resizes (antialiased), repeating the crop's edge pixels",
        "colour jitter: sslkit draws the order of brightness/contrast once per batch, torchvision per image "
        "(factors are per image in both); PIL's contrast uses the rounded integer mean of the image",
        "views: lightly augments each view of each image in a DataLoader worker (PIL, per sample); "
        "sslkit augments the uint8 batch in the training process after the loader",
    ]
    if a.crop_scale[1] != 1.0:
        notes.append(f"crop scale: the recipe's upper bound {a.crop_scale[1]} is not reachable in lightly (fixed 1.0)")
    if tuple(a.crop_ratio) != (0.75, 4.0 / 3.0):
        notes.append(f"crop ratio: the recipe's {tuple(a.crop_ratio)} is not reachable in lightly (3/4..4/3)")
    return notes


def build_simclr(cfg: Config, channels: int, loss: torch.nn.Module):
    """sslkit's backbone, projector and one-batch forward around ``loss``; its optimizer and base lr."""
    from sslkit import models, optim
    from sslkit.methods import SimCLR

    backbone = models.backbone_from_config(cfg.model, channels)
    m = cfg.model
    method = SimCLR(
        backbone, models.build_mlp(backbone.feature_dim, m.projector_hidden, m.projector_out, m.projector_layers), loss
    )
    if m.channels_last:
        models.to_channels_last(method)
    lr = optim.scaled_lr(cfg.optim.lr, cfg.train.batch_size, cfg.optim.lr_scaling)
    lr_scales = {f"backbone.{name}": cfg.optim.backbone_lr_scale for name, _ in backbone.named_parameters()}
    groups = optim.parameter_groups(method, cfg.optim.weight_decay, cfg.optim.exclude_bias_and_norm, lr_scales)
    optimizer = optim.build_optimizer(
        cfg.optim.name,
        groups,
        lr,
        cfg.optim.momentum,
        cfg.optim.weight_decay,
        cfg.optim.betas,
        cfg.optim.trust_coefficient,
    )
    return method, optimizer, lr


def train_lightly(cfg: Config, train_set, num_workers: int, max_steps: int | None = None) -> dict:
    """The lightly loop: per-sample SimCLRTransform in ``num_workers`` workers, lightly's NTXentLoss.

    ``max_steps`` cuts the run short (the worker-count probe); the schedule is the full run's either way.
    """
    from accelerate.utils import set_seed
    from lightly.loss import NTXentLoss

    from sslkit import optim

    torch.set_num_threads(cfg.train.threads)
    # As sslkit's trainer: seed, then build the model, so both start from the same draw.
    set_seed(cfg.run.seed)
    info = train_set.info
    method, optimizer, lr = build_simclr(
        cfg, info.channels, NTXentLoss(temperature=cfg.loss.kwargs.get("temperature", 0.5))
    )
    dataset = PILDataset(train_set.images, train_set.labels, lightly_transform(cfg, info.mean, info.std))
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=cfg.train.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        generator=torch.Generator().manual_seed(cfg.run.seed),
    )
    steps_per_epoch = len(loader)
    total_steps = cfg.train.epochs * steps_per_epoch
    if cfg.train.max_steps is not None:
        total_steps = min(total_steps, cfg.train.max_steps)
    warmup_steps = min(int(cfg.optim.warmup_epochs * steps_per_epoch), total_steps // 2)
    stop = total_steps if max_steps is None else min(total_steps, max_steps)

    method.train()
    step, train_s, waits = 0, 0.0, []
    while step < stop:
        epoch_start = time.perf_counter()
        fetch_start = epoch_start
        for (view1, view2), labels in loader:
            waits.append(time.perf_counter() - fetch_start)
            loss = method(view1, view2)
            loss.item()  # the host sync sslkit's loop makes for its NaN check
            loss.backward()
            optim.set_learning_rate(
                optimizer, optim.cosine_lr(step, total_steps, lr, warmup_steps, cfg.optim.min_lr_ratio)
            )
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step >= stop:
                break
            fetch_start = time.perf_counter()
        train_s += time.perf_counter() - epoch_start
    del loader  # stops persistent workers before the next probe or the evaluation
    return {
        "num_workers": num_workers,
        "images_per_s": step * cfg.train.batch_size / train_s,
        "train_s": train_s,
        "steps": step,
        "data_wait_share": sum(waits) / train_s,
        "data_wait_median_s": statistics.median(waits),
        "data_wait_max_s": max(waits),
        "backbone_module": method.backbone,
    }


# --------------------------------------------------------------------------- evaluation


def knn_of(backbone: torch.nn.Module, cfg: Config, train_set, test_set) -> float:
    """kNN top-1 of frozen ``backbone`` features, exactly as sslkit's trainer evaluates (EvalTransform, k, T)."""
    from sslkit import datasets, evaluation
    from sslkit.augment import EvalTransform

    info = train_set.info
    preprocess = EvalTransform(cfg.augment.image_size, info.channels, info.mean, info.std, cfg.augment.normalize)
    loader = lambda ds: datasets.build_loader(ds, cfg.eval.batch_size, shuffle=False, drop_last=False)  # noqa: E731
    train_x, train_y = evaluation.extract_features(backbone, loader(train_set), preprocess)
    test_x, test_y = evaluation.extract_features(backbone, loader(test_set), preprocess)
    return evaluation.knn_accuracy(
        train_x, train_y, test_x, test_y, info.num_classes, k=cfg.eval.knn_k, temperature=cfg.eval.knn_temperature
    )


def load_backbone(cfg: Config, channels: int, path: str) -> torch.nn.Module:
    from safetensors.torch import load_file

    from sslkit import models

    backbone = models.backbone_from_config(cfg.model, channels)
    backbone.load_state_dict(load_file(path))
    return backbone


# --------------------------------------------------------------------------- summary


def summarize(sslkit: dict, lightly: dict, test_images: int | None = None) -> dict:
    """Ratios of the two sides and plain-words findings.

    Args:
        sslkit, lightly: each with ``images_per_s``, ``knn_top1``, ``data_wait_share``.
        test_images: size of the kNN test set; gives the standard error of the accuracy
            difference (two independent binomial proportions), so a gap within noise is called so.
    """
    speed = sslkit["images_per_s"] / lightly["images_per_s"]
    knn_gap = sslkit["knn_top1"] - lightly["knn_top1"]
    noise = None
    if test_images:
        noise = math.sqrt(sum(p * (1 - p) for p in (sslkit["knn_top1"], lightly["knn_top1"])) / test_images)
    findings = []
    if speed < 1:
        findings.append(f"sslkit trains {1 / speed:.2f}x slower than the lightly loop")
    if knn_gap < 0:
        within = (
            f" (within the {100 * noise:.2f}-point standard error of {test_images} test images)"
            if noise and -knn_gap < 2 * noise
            else ""
        )
        findings.append(f"sslkit's kNN top-1 is {100 * -knn_gap:.2f} points below the lightly loop's{within}")
    if lightly["data_wait_share"] > 0.1:
        findings.append(
            f"the lightly loop waits on its loader {100 * lightly['data_wait_share']:.0f}% of the time "
            f"(per-sample PIL augmentation in {lightly['num_workers']} worker(s))"
        )
    if sslkit["data_wait_share"] > 0.05:
        findings.append(f"sslkit's loop waits on data {100 * sslkit['data_wait_share']:.0f}% of the time")
    return {
        "sslkit_over_lightly_images_per_s": speed,
        "knn_top1_sslkit_minus_lightly": knn_gap,
        "knn_top1_difference_standard_error": noise,
        "sslkit_faster": speed > 1,
        "sslkit_as_accurate": knn_gap >= 0,
        "findings": findings,
    }


def render(result: dict, console: Console) -> None:
    c = result["config"]
    table = Table(
        title=f"race: SimCLR on {result['dataset']} {c['image_size']}x{c['image_size']}, {c['backbone']} width "
        f"{c['width']}, batch {c['batch_size']}, {result['epochs']} epoch(s), {result['threads']} thread(s)"
    )
    for column in ("", "images/s", "data wait", "max wait ms", "train s", "kNN top-1"):
        table.add_column(column, justify="left" if not column else "right")
    s, lt = result["sslkit"], result["lightly"]
    table.add_row(
        "sslkit (sslkit-pretrain)",
        f"{s['images_per_s']:.0f}",
        f"{100 * s['data_wait_share']:.1f}%",
        f"{1e3 * s['data_wait_max_s']:.1f}",
        f"{s['train_s']:.0f}",
        f"{s['knn_top1']:.4f}",
    )
    table.add_row(
        f"lightly loop ({lt['num_workers']} workers)",
        f"{lt['images_per_s']:.0f}",
        f"{100 * lt['data_wait_share']:.1f}%",
        f"{1e3 * lt['data_wait_max_s']:.1f}",
        f"{lt['train_s']:.0f}",
        f"{lt['knn_top1']:.4f}",
    )
    sm = result["summary"]
    table.add_row(
        "sslkit / lightly",
        f"{sm['sslkit_over_lightly_images_per_s']:.2f}x",
        "",
        "",
        "",
        f"{100 * sm['knn_top1_sslkit_minus_lightly']:+.2f} pts",
    )
    console.print(table)
    probe = ", ".join(f"{w} workers {ips:.0f} img/s" for w, ips in result["lightly_worker_probe"].items())
    console.print(f"lightly loader probe ({result['probe_steps']} steps): {probe}; the race used {lt['num_workers']}")
    console.print(
        f"sslkit run directory's own kNN: {s['knn_top1_run_dir']:.4f} "
        "(same evaluator; this table re-evaluates its exported backbone)"
    )
    for finding in sm["findings"]:
        console.print(f"[yellow]finding:[/] {finding}")
    for note in result["differences"]:
        console.print(f"[dim]difference:[/] {note}")
    if result.get("note"):
        console.print(f"[yellow]note:[/] {result['note']}")
    console.print(
        f"load average (1 min) before/after: {result['load_average'][0]:.1f} / {result['load_average'][1]:.1f} "
        f"on {result['cores']} cores"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/bench/race.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", type=Path, help=f"YAML recipe (default {FASHION_RECIPE.relative_to(ROOT)})")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides applied to both sides")
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help=f"epochs for both sides (default {DEFAULT_EPOCHS}: "
        "the recipe's 14 would take about 55 min for both; --quick 1)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads for both sides "
        "(default 1: steady on a shared machine; lightly's workers use further cores)",
    )
    parser.add_argument(
        "--workers", type=int, choices=WORKER_CHOICES, help="lightly loader workers (default: the faster in a probe)"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run on digits with a tiny model")
    parser.add_argument("--workdir", type=Path, help="where the sslkit run writes (default: a temporary directory)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed for the sslkit run")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)

    from sslkit import datasets
    from sslkit.console import print_user_error
    from sslkit.errors import UserError

    load_before = os.getloadavg()[0]
    epochs = args.epochs if args.epochs is not None else (1 if args.quick else DEFAULT_EPOCHS)
    recipe, implied = (args.recipe, []) if args.recipe else default_recipe()
    overrides = implied + race_overrides(args.quick, epochs, args.threads, args.overrides)
    note = None
    try:
        cfg = load_config(recipe, overrides)
        if cfg.data.name == "fashion_mnist":
            try:
                datasets.build_dataset("fashion_mnist", "test", cfg.data.root)
            except UserError:
                note = "Fashion-MNIST files not found: raced on scikit-learn's digits (8x8, crops 16x16) instead"
                overrides = [o for o in overrides if o not in QUICKSTART_FASHION] + [
                    "data.name=digits",
                    "augment.image_size=16",
                ]
                cfg = load_config(recipe, overrides)
        check_raceable(cfg)
        train_set = datasets.build_dataset(cfg.data.name, "train", cfg.data.root)
        test_set = datasets.build_dataset(cfg.data.name, "test", cfg.data.root)
    except UserError as error:
        print_user_error(error)
        return 2
    console = Console(width=max(120, Console().width))
    batches_per_epoch = len(train_set) // cfg.train.batch_size

    with tempfile.TemporaryDirectory(prefix="sslkit-race-") as temporary:
        workdir = args.workdir or Path(temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        console.print(f"sslkit: sslkit-pretrain {recipe.name} {' '.join(overrides)} ({cfg.train.epochs} epoch(s))")
        sslkit = run_sslkit(
            recipe.resolve(), overrides, workdir.resolve(), batches_per_epoch, cfg.train.batch_size, args.timeout
        )
        sslkit["knn_top1"] = knn_of(
            load_backbone(cfg, train_set.info.channels, sslkit["backbone"]), cfg, train_set, test_set
        )

    probe_steps = QUICK_PROBE_STEPS if args.quick else PROBE_STEPS
    probe = {}
    if args.workers is None:
        for workers in WORKER_CHOICES:
            probe[workers] = train_lightly(cfg, train_set, workers, max_steps=probe_steps)["images_per_s"]
            console.print(f"lightly probe: {workers} workers, {probe[workers]:.0f} images/s")
    workers = args.workers if args.workers is not None else max(probe, key=probe.get)
    console.print(f"lightly: {cfg.train.epochs} epoch(s) with {workers} loader workers")
    lightly = train_lightly(cfg, train_set, workers)
    lightly["knn_top1"] = knn_of(lightly.pop("backbone_module"), cfg, train_set, test_set)

    result = {
        "dataset": cfg.data.name,
        "note": note,
        "quick": args.quick,
        "recipe": str(recipe.relative_to(ROOT) if recipe.resolve().is_relative_to(ROOT) else recipe),
        "overrides": overrides,
        "epochs": cfg.train.epochs,
        "threads": cfg.train.threads,
        "cores": os.cpu_count(),
        "config": {
            "batch_size": cfg.train.batch_size,
            "image_size": cfg.augment.image_size,
            "backbone": cfg.model.backbone,
            "width": cfg.model.width,
            "cifar_stem": cfg.model.cifar_stem,
            "input_channels": train_set.info.channels,
            "optimizer": cfg.optim.name,
            "lr": cfg.optim.lr,
            "temperature": cfg.loss.kwargs.get("temperature"),
            "knn_k": cfg.eval.knn_k,
            "knn_temperature": cfg.eval.knn_temperature,
            "seed": cfg.run.seed,
            "sslkit_num_workers": cfg.data.num_workers,
        },
        "sslkit": sslkit,
        "lightly": lightly,
        "lightly_worker_probe": {str(w): ips for w, ips in probe.items()},
        "probe_steps": probe_steps,
        "summary": summarize(sslkit, lightly, len(test_set)),
        "differences": augmentation_differences(cfg),
        "load_average": [load_before, os.getloadavg()[0]],
        "versions": {
            "torch": torch.__version__,
            "lightly": __import__("lightly").__version__,
            "python": platform.python_version(),
        },
    }
    render(result, console)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
        console.print(f"figures written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
