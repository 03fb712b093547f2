"""Run sslkit's benchmarks one after another and print their headline ratios against targets.

    python tools/bench/run.py [--quick] [--only NAME ...] [--out DIR]

Each benchmark (``tools/bench/<name>.py``: losses, augment, knn, train, race) runs as a
subprocess with ``--out DIR/<name>.json`` (and ``--quick`` passed through); its own table is
echoed as it prints. Then one table gathers the headline figures from those JSON files, each
with its target and pass / fail, and ``DIR/summary.json`` records them with every
benchmark's command, duration and, when it failed, its error. A failed benchmark does not
stop the others.

Targets (see tools/bench/README.md for how each figure is measured):

- augmentation: sslkit >= 10x torchvision v2 per image, and faster than default kornia;
- NT-Xent / DCL / SupCon fwd+bwd at 2N = 1024, D = 128: <= 1.5x three bare matmuls, faster than lightly / pml;
- ArcFace / CosFace / SphereFace at B = 512, D = 512, C = 10,000: <= 1.15x three bare matmuls, faster than pml;
- kNN: faster than scikit-learn;
- training: the loop waits on data for a small share of the step (< 5%).

The race (sslkit against a lightly loop) has no target: its ratios are reported as they are.
Only the standard library and rich are imported here, so the runner starts at once and a
benchmark's import error is that benchmark's failure.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host import describe_host, host_line  # noqa: E402  (standard library only, like this runner)

ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = Path(__file__).resolve().parent
BENCHMARKS = ("losses", "augment", "knn", "train", "race")
# For a benchmark without --quick of its own: arguments that make it a smoke run.
QUICK_FALLBACK = {"augment": ["--batch", "64", "--repeats", "2"]}
DATA_WAIT_TARGET = 0.05


@dataclass
class Headline:
    """One row of the combined table."""

    benchmark: str
    figure: str
    value: float | None
    shown: str  # the value as the table prints it
    target: str
    passed: bool | None  # None: no target, or the figure is missing
    note: str = ""


# --------------------------------------------------------------------------- running


def has_quick_flag(script: Path) -> bool:
    """Whether a benchmark script defines ``--quick`` (read from its source: no import, no subprocess)."""
    return '"--quick"' in script.read_text()


def command_for(name: str, quick: bool, out: Path) -> list[str]:
    script = BENCH_DIR / f"{name}.py"
    quick_args = []
    if quick:
        quick_args = ["--quick"] if has_quick_flag(script) else QUICK_FALLBACK.get(name, [])
    return [sys.executable, str(script), *quick_args, "--out", str(out)]


def run_benchmark(name: str, command: list[str], console: Console, timeout: float) -> dict:
    """Run one benchmark, echoing its output; returns its status, duration and, on failure, the error."""
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        COLUMNS=str(max(console.width, 120)),
    )
    console.rule(f"[bold]{name}")
    console.print(" ".join(command[1:]), style="dim", highlight=False)
    tail: collections.deque[str] = collections.deque(maxlen=20)

    def echo(stream) -> None:
        for line in stream:
            print(line, end="", flush=True)
            tail.append(line.rstrip())

    start = time.perf_counter()
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT, start_new_session=True
    ) as process:
        # A thread reads the output so that a benchmark that prints nothing can still be timed out.
        reader = threading.Thread(target=echo, args=(process.stdout,), daemon=True)
        reader.start()
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # Its own process group: the race's pretrain run and loader workers go with it.
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            returncode = None
        reader.join(timeout=5)
    seconds = time.perf_counter() - start
    record = {"command": command[1:], "seconds": seconds, "returncode": returncode}
    if returncode == 0:
        return {**record, "status": "ok"}
    reason = f"timed out after {timeout:.0f} s" if returncode is None else f"exit code {returncode}"
    last = next((line for line in reversed(tail) if line.strip()), "")
    return {**record, "status": "error", "error": f"{reason}: {last}", "output_tail": list(tail)}


# --------------------------------------------------------------------------- headlines


def _ratio_row(
    benchmark: str,
    figure: str,
    value: float | None,
    target: str,
    passed: Callable[[float], bool],
    suffix: str = "x",
    note: str = "",
) -> Headline:
    if value is None:
        return Headline(benchmark, figure, None, "-", target, None, note or "not measured")
    return Headline(benchmark, figure, value, f"{value:.2f}{suffix}", target, passed(value), note)


def losses_headlines(report: dict) -> list[Headline]:
    """NT-Xent / DCL / SupCon and ArcFace / CosFace / SphereFace against three matmuls and their peer."""
    rows = []
    sections = (
        ("batch_losses", ("ntxent", "dcl", "supcon", "supcon, 100 classes"), 1.5),
        ("heads", ("arcface", "cosface", "sphereface"), 1.15),
    )
    for section, names, limit in sections:
        by_name = {r["loss"]: r for r in report.get(section, [])}
        for name in names:
            r = by_name.get(name, {})
            note = r.get("note") or ("; ".join(f"{k}: {v}" for k, v in r.get("errors", {}).items()))
            rows.append(
                _ratio_row(
                    "losses",
                    f"{name} fwd+bwd / 3 matmuls",
                    r.get("sslkit_over_matmul3"),
                    f"<= {limit}x",
                    lambda v, limit=limit: v <= limit,
                    note=note,
                )
            )
            peer = r.get("peer", "peer")
            rows.append(
                _ratio_row(
                    "losses",
                    f"{name}: sslkit / {peer}",
                    r.get("sslkit_over_peer"),
                    "< 1x (faster)",
                    lambda v: v < 1,
                    note=note,
                )
            )
    return rows


def augment_headlines(report: dict) -> list[Headline]:
    pipelines = report.get("pipelines", {})
    speedup = lambda name: pipelines.get(name, {}).get("sslkit_speedup_wall")  # noqa: E731
    return [
        _ratio_row(
            "augment",
            "speed-up over torchvision v2 per image",
            speedup("torchvision-per-image"),
            ">= 10x",
            lambda v: v >= 10,
        ),
        _ratio_row("augment", "speed-up over default kornia", speedup("kornia-sequential"), "> 1x", lambda v: v > 1),
    ]


def knn_headlines(report: dict) -> list[Headline]:
    return [
        _ratio_row(
            "knn", "speed-up over sklearn (brute cosine)", report.get("sklearn_over_sslkit"), "> 1x", lambda v: v > 1
        )
    ]


def train_headlines(report: dict) -> list[Headline]:
    s = report.get("summary", {})
    wait, full, floor = s.get("data_wait", {}), s.get("full", {}), s.get("floor", {})
    rows = []
    share = wait.get("share")
    if share is None:
        rows.append(
            Headline(
                "train", "data-wait share of step time", None, "-", f"< {DATA_WAIT_TARGET:.0%}", None, "not measured"
            )
        )
    else:
        note = f"per step: median {1e3 * wait['median_s']:.2f} ms, max {1e3 * wait['max_s']:.2f} ms"
        rows.append(
            Headline(
                "train",
                "data-wait share of step time",
                share,
                f"{100 * share:.2f}%",
                f"< {DATA_WAIT_TARGET:.0%}",
                share < DATA_WAIT_TARGET,
                note,
            )
        )
    if "images_per_s" in full:
        rows.append(
            Headline(
                "train",
                "images/s, full step",
                full["images_per_s"],
                f"{full['images_per_s']:.0f}",
                "-",
                None,
                f"floor (no data, no augmentation): {floor.get('images_per_s', float('nan')):.0f}",
            )
        )
    if "data_and_augment_share_in_step" in s:
        value = s["data_and_augment_share_in_step"]
        note = (
            f"timed inside the step; against the floor: {100 * s['data_and_augment_share']:.1f}% (wall), "
            f"{100 * s['data_and_augment_share_cpu']:.1f}% (CPU)"
        )
        rows.append(
            Headline("train", "data + augmentation share of the step", value, f"{100 * value:.1f}%", "-", None, note)
        )
    return rows


def race_headlines(report: dict) -> list[Headline]:
    s = report.get("summary", {})
    rows = []
    if "sslkit_over_lightly_images_per_s" in s:
        v = s["sslkit_over_lightly_images_per_s"]
        note = (
            f"sslkit {report['sslkit']['images_per_s']:.0f} img/s, "
            f"lightly loop {report['lightly']['images_per_s']:.0f} img/s "
            f"({report['lightly']['num_workers']} workers)"
        )
        rows.append(Headline("race", "images/s, sslkit / lightly loop", v, f"{v:.2f}x", "-", None, note))
    if "knn_top1_sslkit_minus_lightly" in s:
        v = s["knn_top1_sslkit_minus_lightly"]
        error = s.get("knn_top1_difference_standard_error")
        note = (
            f"sslkit {report['sslkit']['knn_top1']:.4f}, lightly loop {report['lightly']['knn_top1']:.4f}, "
            f"{report['epochs']} epoch(s)" + (f"; standard error {100 * error:.2f} pts" if error else "")
        )
        rows.append(Headline("race", "kNN top-1, sslkit - lightly loop", v, f"{100 * v:+.2f} pts", "-", None, note))
    return rows


HEADLINES: dict[str, Callable[[dict], list[Headline]]] = {
    "losses": losses_headlines,
    "augment": augment_headlines,
    "knn": knn_headlines,
    "train": train_headlines,
    "race": race_headlines,
}


def headlines_for(name: str, run: dict, json_path: Path) -> list[Headline]:
    """Headline rows of one benchmark from its JSON, or one row saying why there are none."""
    if run["status"] != "ok":
        return [Headline(name, "benchmark failed", None, "-", "-", False, run.get("error", ""))]
    try:
        report = json.loads(json_path.read_text())
        if not isinstance(report, dict):
            raise TypeError(f"{json_path.name} holds a {type(report).__name__}, not an object of figures")
        rows = HEADLINES[name](report)
    except (OSError, ValueError, KeyError, TypeError) as error:  # no JSON, or not the layout expected
        return [Headline(name, "report unreadable", None, "-", "-", False, f"{type(error).__name__}: {error}")]
    return rows or [Headline(name, "no headline figures", None, "-", "-", None, "")]


def render(rows: list[Headline], quick: bool, console: Console) -> None:
    caption = "--quick: smoke-run sizes, the ratios do not answer the targets" if quick else None
    table = Table(title="sslkit benchmarks: headline figures", caption=caption)
    for column in ("benchmark", "figure", "value", "target", "result", "note"):
        table.add_column(column, justify="right" if column in ("value", "target") else "left")
    marks = {True: "[green]pass[/]", False: "[red]fail[/]", None: "-"}
    for r in rows:
        table.add_row(r.benchmark, r.figure, r.shown, r.target, marks[r.passed], r.note)
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/bench/run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark (smoke sizes)")
    parser.add_argument(
        "--only", nargs="+", choices=BENCHMARKS, metavar="NAME", help=f"run only these, of: {', '.join(BENCHMARKS)}"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("runs/bench"), help="directory for <name>.json and summary.json"
    )
    parser.add_argument("--timeout", type=float, default=4 * 3600.0, help="seconds allowed per benchmark")
    args = parser.parse_args(argv)

    names = [name for name in BENCHMARKS if not args.only or name in args.only]
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    console = Console(width=max(140, Console().width))
    load_before = os.getloadavg()[0]
    host = describe_host()
    console.print(f"host: {host_line(host)}", markup=False, highlight=False)  # ratios depend on it (host.py)
    started = time.time()
    runs, rows = {}, []
    for name in names:
        json_path = out / f"{name}.json"
        json_path.unlink(missing_ok=True)  # a stale report must not pass for this run's
        runs[name] = {
            **run_benchmark(name, command_for(name, args.quick, json_path), console, args.timeout),
            "json": str(json_path),
        }
        rows += headlines_for(name, runs[name], json_path)
    console.rule("[bold]summary")
    render(rows, args.quick, console)
    failed = [name for name, run in runs.items() if run["status"] != "ok"]
    summary = {
        "quick": args.quick,
        "started_unix": started,
        "seconds": time.time() - started,
        "load_average_1min": [load_before, os.getloadavg()[0]],
        "cores": os.cpu_count(),
        "host": host,
        "python": platform.python_version(),
        "benchmarks": runs,
        "headlines": [asdict(r) for r in rows],
        "failed": failed,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(f"summary written to {out / 'summary.json'}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
