"""sslkit.experiments.report and sslkit-report on run directories the tests write in the trainer's formats:
``config.yaml`` (``save_config``), ``metrics.jsonl`` (step, epoch and final records) and
``results.json``; with matplotlib, without it (its import blocked), and for unfinished runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sslkit.config import Config, save_config
from sslkit.errors import UserError
from sslkit.experiments.report import read_metrics, write_report

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEPS_PER_EPOCH = 10


def write_run(run_dir: Path, epochs: int = 3, finished: bool = True, torn_last_line: bool = False) -> Path:
    """A run directory as the training loop leaves it (without checkpoints and weights)."""
    run_dir.mkdir(parents=True)
    cfg = Config()
    cfg.run.name, cfg.run.output_dir = run_dir.name, str(run_dir.parent)
    cfg.loss.kwargs = {"temperature": 0.2}
    cfg.train.epochs = epochs
    save_config(cfg, run_dir / "config.yaml")
    lines = []
    for epoch in range(epochs):
        for i in range(STEPS_PER_EPOCH):
            step = epoch * STEPS_PER_EPOCH + i + 1
            lines.append(
                {
                    "step": step,
                    "epoch": epoch,
                    "loss": 6.0 - 0.05 * step,
                    "lr": 0.3 * (1 - step / 40),
                    "images_per_s": 1000.0 + step,
                    "data_wait_share": 0.02,
                }
            )
        if epoch + 1 < epochs:  # the trainer's monitor skips the last epoch: the final evaluation covers it
            lines.append({"step": (epoch + 1) * STEPS_PER_EPOCH, "epoch": epoch + 1, "knn_top1": 0.5 + 0.1 * epoch})
    if finished:
        final = {"knn_top1": 0.8125, "linear_top1": 0.84375, "linear_top5": 0.99, "linear_train_top1": 0.9}
        lines.append(
            {"step": epochs * STEPS_PER_EPOCH, "epoch": epochs, **{f"final_{k}": v for k, v in final.items()}}
        )
        (run_dir / "results.json").write_text(
            json.dumps(
                {
                    "results": {"trained": final, "random init": {"knn_top1": 0.25, "linear_top1": 0.3}},
                    "step": epochs * STEPS_PER_EPOCH,
                    "checkpoint": str(run_dir / "checkpoints" / "step-00000030"),
                    "backbone": str(run_dir / "backbone.safetensors"),
                },
                indent=2,
            )
        )
    text = "".join(json.dumps(r) + "\n" for r in lines)
    if torn_last_line:
        text += '{"step": 31, "epoch": 3, "lo'  # the trainer is writing this line right now
    (run_dir / "metrics.jsonl").write_text(text)
    return run_dir


def block_matplotlib(monkeypatch) -> None:
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)


def test_finished_run_with_plots(tmp_path):
    run = write_run(tmp_path / "simclr")
    path = write_report(run)
    assert path == run / "report.md"
    text = path.read_text()
    assert "finished at step 30" in text
    assert "| encoder | knn_top1 | linear_top1 | linear_top5 | linear_train_top1 |" in text
    assert "| trained | 0.8125 | 0.8438 | 0.9900 | 0.9000 |" in text
    assert "| random init | 0.2500 | 0.3000 | - | - |" in text
    assert "| last loss | 4.5000 |" in text and "| median images/s | 1016 |" in text
    for name in ("report-loss.png", "report-lr.png", "report-knn_top1.png"):
        assert (run / name).read_bytes().startswith(PNG_MAGIC)
        assert f"]({name})" in text  # linked relative to the report, so the folder can move
    assert "pip install" not in text
    config = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert config == (run / "config.yaml").read_text()  # the resolved config, verbatim
    assert "temperature: 0.2" in config


def test_finished_run_without_matplotlib_has_text_tables(tmp_path, monkeypatch):
    run = write_run(tmp_path / "simclr")
    block_matplotlib(monkeypatch)
    text = write_report(run).read_text()
    assert not list(run.glob("*.png")) and ".png" not in text
    assert '`pip install "sslkit[plot]"` adds the plots' in text
    assert "| trained | 0.8125 | 0.8438 |" in text
    loss_rows = [
        line for line in text.splitlines() if line.startswith("| ") and line.count("|") == 5 and line[2].isdigit()
    ]
    assert len(loss_rows) == 20 and "20 of 30 logged steps" in text  # sampled, evenly spaced
    assert loss_rows[0].startswith("| 1 | 0 | 5.9500 |") and loss_rows[-1].startswith("| 30 | 2 | 4.5000 |")
    # the kNN curve: the epoch monitor, then the final evaluation as its last point
    assert "| 1 | 10 | 0.5000 |" in text and "| 2 | 20 | 0.6000 |" in text and "| 3 (final) | 30 | 0.8125 |" in text


def test_unfinished_run_gives_a_partial_report(tmp_path, monkeypatch):
    run = write_run(tmp_path / "running", finished=False, torn_last_line=True)
    assert len(read_metrics(run / "metrics.jsonl")) == 32  # 30 steps, 2 kNN records; the torn line is skipped
    block_matplotlib(monkeypatch)
    text = write_report(run).read_text()
    assert "unfinished; last logged step 30 (epoch 2)" in text
    assert "No `results.json` yet" in text
    assert "(final)" not in text and "| 2 | 20 | 0.6000 |" in text


def test_unfinished_run_with_plots(tmp_path):
    run = write_run(tmp_path / "running", epochs=1, finished=False)
    text = write_report(run).read_text()
    assert "No `results.json` yet" in text
    assert (run / "report-loss.png").is_file() and not (run / "report-knn_top1.png").exists()
    assert "No kNN records yet" in text


def test_run_that_logged_nothing_yet(tmp_path):
    run = tmp_path / "starting"
    run.mkdir()
    save_config(Config(), run / "config.yaml")
    text = write_report(run).read_text()
    assert "nothing logged yet" in text and "Nothing logged yet." in text and "```yaml" in text


def test_not_a_run_directory(tmp_path):
    with pytest.raises(UserError, match="not a run directory"):
        write_report(tmp_path)


def test_command_renders_runs_and_gives_one_line_for_a_non_run(tmp_path):
    good = write_run(tmp_path / "runs" / "a")
    result = subprocess.run(
        [sys.executable, "-m", "sslkit.cli.report", str(good)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert f"report: {good / 'report.md'}" in result.stdout and (good / "report.md").is_file()

    result = subprocess.run(
        [sys.executable, "-m", "sslkit.cli.report", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "not a run directory" in lines[0] and "runs/*" in lines[0], result.stderr


def test_command_without_matplotlib_installed(tmp_path):
    """A fresh interpreter where ``import matplotlib`` fails, as on an install without the plot extra."""
    run = write_run(tmp_path / "a")
    block = (
        "import runpy, sys; sys.modules['matplotlib'] = None; "
        f"sys.argv = ['sslkit-report', {str(run)!r}]; "
        "runpy.run_module('sslkit.cli.report', run_name='__main__')"
    )
    result = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert 'pip install "sslkit[plot]"' in result.stdout
    assert not list(run.glob("*.png")) and 'pip install "sslkit[plot]"' in (run / "report.md").read_text()
