"""Terminal output: tables too wide for a log's 80 columns keep their numbers whole, and so do its lines."""

from __future__ import annotations

import subprocess
import sys

import pytest
from rich.table import Table

from sslkit.console import console, print_table


def test_a_table_wider_than_the_console_prints_whole_and_the_width_comes_back(capsys):
    table = Table(title="comparison")
    for title in ("recipe", "kNN", "linear", "fine-tune 0.01", "img/s", "steps", "train s"):
        table.add_column(title)
    table.add_row("fashion_mnist_simclr_multicrop", *["0.8444 ± 0.0012"] * 3, "684", "1602", "972 ± 328")
    width = console.width
    print_table(table)
    out = capsys.readouterr().out
    assert out.count("0.8444 ± 0.0012") == 3 and "fashion_mnist_simclr_multicrop" in out and "…" not in out
    assert max(len(line) for line in out.splitlines()) > width  # wider than the console, not squeezed into it
    assert console.width == width


def test_a_run_prints_what_its_recipe_changed_and_where_the_full_config_is(capsys):
    from accelerate import Accelerator

    from sslkit.config import flatten, load_config, to_dict
    from sslkit.console import print_config
    from sslkit.loop.run import _defaults, _precision

    cfg = load_config("quickstart", ["train.epochs=3", "method.name=moco", "method.queue_size=512"])
    print_config(flatten(to_dict(cfg)), _defaults(cfg), "sslkit pretrain — runs/x", "runs/x/config.yaml")
    out = capsys.readouterr().out
    assert "epochs=3" in out and "queue_size=512" in out and "name=digits" in out and "name=moco" in out
    assert "momentum=" not in out  # MoCo's own default momentum is not a change
    assert "runs/x/config.yaml" in out and len(out.splitlines()) < 25  # not the 150 lines of the whole config
    assert _precision(Accelerator(cpu=True, mixed_precision="no")) == "fp32"


def test_the_progress_bar_shows_no_loss_or_speed_before_the_first_logged_step():
    from rich.progress import TextColumn

    from sslkit.loop.logs import ProgressBar
    from sslkit.loop.state import LoopState

    bar = ProgressBar(LoopState(), total_steps=10, main=True)
    task = bar.bar.tasks[0]

    def shown() -> str:
        return " ".join(str(c.render(task)) for c in bar.bar.columns if isinstance(c, TextColumn))

    assert "first steps" in shown() and "nan" not in shown() and "0 img/s" not in shown()
    bar.update(2, 0, {"loss": 6.25, "lr": 1e-3, "ips": 120.4})
    assert "loss 6.2500 lr 1.00e-03 120 img/s" in shown() and task.completed == 2


def test_images_per_second_count_every_image_a_batch_loaded():
    """A FixMatch batch of train.batch_size 32 and mu 7 loads 256 images: the speed counts them all."""
    import time

    import torch
    from accelerate import Accelerator

    from sslkit.loop.logs import LogWindow
    from sslkit.loop.state import LoopState
    from sslkit.loop.step import FiniteLoss

    accelerator = Accelerator(cpu=True)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    before = time.perf_counter()
    window = LogWindow(FiniteLoss(accelerator))
    for loss in (1.0, 2.0, 3.0):
        window.add(torch.tensor(loss), images=256)
    time.sleep(0.05)
    added = time.perf_counter()
    record = window.record(LoopState(step=3), optimizer, accelerator)
    after = time.perf_counter()
    assert record["loss"] == pytest.approx(2.0)
    assert 3 * 256 / (after - before) <= record["images_per_s"] <= 3 * 256 / (added - window.start)


def test_under_accelerate_launch_a_users_mistake_says_how_to_leave_out_the_launchers_traceback(monkeypatch, capsys):
    from sslkit.console import print_user_error

    print_user_error(ValueError("train.epochs must be int"))
    assert capsys.readouterr().err.strip() == "error: train.epochs must be int"
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "NO")
    print_user_error(ValueError("train.epochs must be int"))
    line = capsys.readouterr().err.strip()
    assert line.startswith("error: train.epochs must be int (accelerate launch") and "accelerate launch -q" in line


def test_a_long_line_into_a_log_stays_one_line():
    path = "/runs/" + "a-long-folder-name/" * 8 + "checkpoints"
    script = f"from sslkit.console import console; console.print('resumed from {path}', highlight=False)"
    printed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60).stdout
    assert printed == f"resumed from {path}\n"  # a pipe, as a log file: not folded at 80 columns
