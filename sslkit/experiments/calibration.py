"""How fast a recipe trains, from a short calibration run, and the steps that speed allows in a time budget.

A calibration (:mod:`sslkit.experiments.compare`'s first run of every recipe) trains ``WARMUP_STEPS``
untimed steps (oneDNN builds its kernels on the first calls), then the steps it times; the loop logs
images/s over every window of ``LOG_EVERY`` steps (``metrics.jsonl``). Then

    images/s = timed images / timed seconds over the windows after the warm-up
    steps = floor(minutes x 60 x images/s / images per step), at least 1

This module imports neither sslkit.config nor torch: ``sslkit-compare --help`` names the warm-up.

>>> budget_steps(10, 600.0, 256)
1406
"""

from __future__ import annotations

import json
import math
from pathlib import Path

WARMUP_STEPS = 10  # untimed steps of a calibration
LOG_EVERY = 5  # the calibration's log window: every window after the warm-up is timed
# What a calibration leaves out: it times the training steps, its evaluation is not read.
CALIBRATION = [
    "train.knn_every_epochs=0",
    "eval.linear_epochs=0",
    "eval.compare_random_init=false",
    "eval.compare_raw_pixels=false",
    f"train.log_every_steps={LOG_EVERY}",
]


def images_per_s(metrics_path: Path, images_per_step: int, after_step: int = 0) -> tuple[float, float] | None:
    """(images/s, seconds) over the log windows of ``metrics.jsonl`` that end after ``after_step``.

    A window's record holds its last step and its images/s; its images are the steps since the
    previous record times the images of a step (a window covers the steps since the last line).
    """
    try:
        lines = metrics_path.read_text().splitlines()
    except OSError:
        return None
    images = seconds = 0.0
    previous = 0
    for line in lines:
        record = json.loads(line)
        if "images_per_s" not in record:
            continue  # a kNN monitor line
        count = (record["step"] - previous) * images_per_step
        previous = record["step"]
        if record["step"] > after_step and record["images_per_s"] > 0:
            images, seconds = images + count, seconds + count / record["images_per_s"]
    return (images / seconds, seconds) if seconds else None


def budget_steps(minutes: float, speed: float, images_per_step: int) -> int:
    """Optimizer steps that take ``minutes`` at ``speed`` images/s (at least 1)."""
    return max(1, math.floor(minutes * 60 * speed / images_per_step))
