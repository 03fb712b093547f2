"""Experiment trackers (``train.trackers``: W&B, TensorBoard) through Accelerate's tracking API."""

from __future__ import annotations

import secrets
from pathlib import Path

from accelerate import Accelerator

from sslkit.config import Config, flatten, to_dict

WANDB_ID_FILE = "wandb_id.txt"


def tracker_run_id(path: Path) -> str:
    """The run's tracker id read from ``path``, or a new one written there (8 hex digits, as W&B's own)."""
    if path.is_file() and (saved := path.read_text().strip()):
        return saved
    new = secrets.token_hex(4)
    path.write_text(new + "\n")
    return new


def start_trackers(cfg: Config, run_dir: Path, accelerator: Accelerator) -> None:
    """``train.trackers`` get the resolved config as hyperparameters (lists as text: TensorBoard's hparams take
    scalars only), under the project name ``sslkit``: TensorBoard writes to ``run_dir/sslkit``, W&B to
    ``run_dir/wandb`` as a run named ``run.name`` in project ``sslkit``."""
    if not cfg.train.trackers:
        return
    hparams = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in flatten(to_dict(cfg)).items()}
    init_kwargs = {"wandb": {"name": cfg.run.name, "dir": str(run_dir)}}
    if "wandb" in cfg.train.trackers and accelerator.is_main_process:
        # A resumed run continues its W&B run instead of starting a second one: the id lives in the run directory.
        init_kwargs["wandb"].update(id=tracker_run_id(run_dir / WANDB_ID_FILE), resume="allow")
    accelerator.init_trackers("sslkit", config=hparams, init_kwargs=init_kwargs)
