"""Run many sslkit commands one after another, each in its own process, resumably: the runner of the
ablation, the label-efficiency comparison and the recipe comparison.

Every job is the user's own command started as a module (``python -m sslkit.cli.pretrain ...``, or
the launcher with ``-m``), so a job that crashes or diverges cannot take the others down. A job
whose result file holds its metrics is skipped ("done, skipped"); any other runs (again: a
pretraining run continues from its last checkpoint with ``run.resume=auto``). A job that fails is
recorded with its error line, the jobs that need it are recorded as not run, and the others go on.
The caller's tables are rewritten after every job, and Ctrl-C stops the sweep where the same
command continues it. The runner shows its progress as it goes; what an experiment has to say at
its end (its tables, where they are, what failed) is an :class:`Outcome` for the command to print.

>>> command("sslkit.cli.pretrain", ["quickstart", "train.epochs=1"], "accelerate launch --cpu")
['accelerate', 'launch', '--cpu', '-m', 'sslkit.cli.pretrain', 'quickstart', 'train.epochs=1']
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from sslkit.config import flatten
from sslkit.console import console
from sslkit.errors import UserError

PRETRAIN = "sslkit.cli.pretrain"
EVALUATE = "sslkit.cli.evaluate"
EMBED = "sslkit.cli.embed"
SELECT = "sslkit.cli.label_selection"
TRAINED = ("results", "trained")  # where a pretraining run's results.json holds the trained encoder's metrics
TIMES = ("wall_s", "cpu_s")  # what a job cost: wall seconds, and CPU seconds of all its processes together


def command(module: str, args: list[str], launcher: str | None = None) -> list[str]:
    """``python -m MODULE ARGS``, or ``LAUNCHER -m MODULE ARGS`` (accelerate launch and torchrun take ``-m``)."""
    prefix = shlex.split(launcher) if launcher else [sys.executable]
    return [*prefix, "-m", module, *args]


@dataclass
class Job:
    """One process of a sweep: its command, the JSON file whose metrics say it finished, and the jobs it needs.

    ``fields`` are the caller's own columns (swept values, seed, kind, ...), copied into the job's record.
    ``complete_key``: a key at the top of ``result`` that must be true for the job to count as finished, for a
    result file written before the job ends (an embeddings folder's meta.json says ``complete`` at its end).
    """

    name: str
    command: list[str]
    result: Path
    metrics_at: tuple[str, ...] = TRAINED  # the keys that lead to the metrics in ``result``
    needs: tuple[str, ...] = ()
    shown: tuple[str, ...] = ("knn_top1", "linear_top1")  # printed when it finishes
    fields: dict[str, Any] = field(default_factory=dict)
    complete_key: str | None = None


def read_metrics(path: Path, keys: tuple[str, ...] = TRAINED) -> dict[str, float] | None:
    """The numbers under ``keys`` in the JSON file at ``path``, or None when it (or that entry) is missing."""
    try:
        metrics = json.loads(path.read_text())
        for key in keys:
            metrics = metrics[key]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(metrics, dict):
        return None
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def finished_metrics(job: Job) -> dict[str, float] | None:
    """The metrics of ``job``'s result file when it says the job finished (:func:`read_metrics`), else None."""
    metrics = read_metrics(job.result, job.metrics_at)
    if metrics is None or job.complete_key is None:
        return metrics
    try:
        complete = json.loads(job.result.read_text()).get(job.complete_key) is True
    except (OSError, ValueError, AttributeError):
        return None
    return metrics if complete else None


def run_process(command: list[str], log_dir: Path, name: str) -> tuple[int, str | None, float, float]:
    """Run one command, its stdout and stderr to ``log_dir/<name>.out`` / ``.err``.

    Returns:
        (exit status, its error line or None, wall seconds, CPU seconds). The CPU seconds are user plus
        system time of the command and every process it waited for (a launcher's workers too): on a
        machine shared with other jobs they say what the job cost where its wall time does not.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    err_path = log_dir / f"{name}.err"
    start, cpu_start = time.perf_counter(), children_cpu_seconds()
    with open(log_dir / f"{name}.out", "w") as out_file, open(err_path, "w") as err_file:
        # Unbuffered: a job's log is readable while it runs.
        status = subprocess.run(
            command, stdout=out_file, stderr=err_file, env=dict(os.environ, PYTHONUNBUFFERED="1")
        ).returncode
    wall, cpu = time.perf_counter() - start, children_cpu_seconds() - cpu_start
    return status, (None if status == 0 else error_line(err_path.read_text(errors="replace"), status)), wall, cpu


def children_cpu_seconds() -> float:
    """User plus system CPU seconds of this process's children that have ended and been waited for (with
    theirs, waited for in turn): the runner runs one job at a time, so a job's cost is the difference."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def error_line(stderr: str, status: int) -> str:
    """What went wrong, in one line: sslkit's own ``error:`` line, else the last line of stderr."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    # Under a launcher, the launcher's traceback follows the job's own one-line error.
    ours = [line for line in lines if line.startswith("error:")]
    if ours:
        return ours[-1].removeprefix("error:").strip()
    if lines:
        return lines[-1]
    if status < 0:
        return f"killed by {signal.Signals(-status).name}"
    return f"exited with status {status} and printed nothing on stderr"


def run_or_skip(job: Job, log_dir: Path, previous: dict[str, float | None] | None, failed: dict[str, str]) -> dict:
    """One job's record: read from its result file when that holds metrics, else from running it.

    ``previous`` holds the :data:`TIMES` of the run that made a skipped job's result, when known; ``failed``
    maps the jobs that failed so far to their errors; a job that needs one of them is not started.
    """
    record = {
        "name": job.name,
        **job.fields,
        "status": "ok",
        "skipped": False,
        "error": None,
        "wall_s": None,
        "cpu_s": None,
        "metrics": {},
        "result": str(job.result),
        "command": shlex.join(job.command),
    }
    metrics = finished_metrics(job)
    if metrics is not None:
        return {**record, "skipped": True, "metrics": metrics, **(previous or {})}
    blocked = [name for name in job.needs if name in failed]
    if blocked:
        return {**record, "status": "failed", "error": f"not run: {blocked[0]} failed"}
    status, error, wall, cpu = run_process(job.command, log_dir, job.name)
    record.update(wall_s=wall, cpu_s=cpu)
    metrics = finished_metrics(job) if status == 0 else None
    if metrics is None:
        return {**record, "status": "failed", "error": error or f"finished without writing {job.result.name}"}
    return {**record, "metrics": metrics}


def run_jobs(
    jobs: list[Job],
    out: Path,
    previous: dict[str, dict[str, float | None]],
    after_each: Callable[[list[dict]], None],
    noun: str,
) -> list[dict] | None:
    """Run (or skip) every job in order under a progress bar, calling ``after_each(records)`` after each.

    Args:
        previous: the :data:`TIMES` of jobs an earlier invocation ran, by name (skipped jobs keep theirs);
            updated with every job that runs.
        noun: what the jobs are to the user ("points", "runs"), for the progress bar and the messages.

    Returns:
        The records in job order, or None when Ctrl-C stopped the sweep (a line says how to continue).
    """
    records: list[dict] = []
    failed: dict[str, str] = {}
    progress = Progress(
        TextColumn(f"[bold]{noun}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[current]}"),
        TimeElapsedColumn(),
        console=console,
    )
    try:
        with progress:
            task = progress.add_task(noun, total=len(jobs), current="")
            for index, job in enumerate(jobs, 1):
                progress.update(task, current=job.name)
                record = run_or_skip(job, out / "logs", previous.get(job.name), failed)
                if record["status"] == "failed":
                    failed[job.name] = record["error"]
                progress.console.print(
                    f"{escape(f'[{index}/{len(jobs)}] {job.name}')}: {outcome(record, job.shown)}",
                    highlight=False,
                    soft_wrap=True,
                )
                records.append(record)
                if record["wall_s"] is not None:
                    previous[job.name] = {key: record[key] for key in TIMES}
                after_each(records)
                progress.advance(task)
    except KeyboardInterrupt:
        console.print(
            f"interrupted: the same command continues (finished {noun} are skipped, the stopped one resumes from "
            f"its last checkpoint); results so far in {out}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        return None
    return records


def outcome(record: dict, shown: tuple[str, ...]) -> str:
    """A finished job in a few words (rich markup): skipped, failed and why, or ok with its headline metrics."""
    if record["skipped"]:
        return "done, skipped"
    after = "" if record["wall_s"] is None else f" after {record['wall_s']:.0f} s"
    if record["status"] == "failed":
        return f"[red]failed[/]{after}: {escape(record['error'])}"
    figures = ", ".join(f"{m} {record['metrics'][m]:.4f}" for m in shown if m in record["metrics"])
    cost = f"ok in {record['wall_s']:.0f} s" + ("" if record["cpu_s"] is None else f" ({record['cpu_s']:.0f} CPU-s)")
    return cost + (f": {figures}" if figures else "")


@dataclass
class Outcome:
    """How an experiment ended: its jobs' records, what it has to show, and the command's exit status.

    Attributes:
        records: every job's record, in order; None when Ctrl-C stopped the experiment.
        tables: its summary tables, to print in order.
        notes: the lines after them: where the results are, how many jobs failed.
        exit_status: 0 when every job succeeded, 1 when any failed, 130 when Ctrl-C stopped it.
    """

    records: list[dict] | None
    tables: list[Table] = field(default_factory=list)
    notes: list[Text] = field(default_factory=list)
    exit_status: int = 0


def interrupted() -> Outcome:
    """The outcome of an experiment Ctrl-C stopped (:func:`run_jobs` has said how to continue it)."""
    return Outcome(None, exit_status=130)


def finished(records: list[dict], out: Path, noun: str, tables: list[Table], results: str) -> Outcome:
    """The outcome of an experiment that ran every job: its tables, then ``results`` (where they are written) and,
    when any job failed, a line saying how many and where their logs are (exit status 1)."""
    failed = [r for r in records if r["status"] == "failed"]
    notes = [Text(results)]
    if failed:
        notes.append(
            Text.from_markup(
                f"[red]{len(failed)} of {len(records)} {noun} failed[/]; rerunning the same command retries them "
                f"(logs in {escape(str(out / 'logs'))})"
            )
        )
    return Outcome(records, tables, notes, 1 if failed else 0)


def refuse_changed_run(run_dir: Path, wanted: dict, path_keys: tuple[str, ...], what: str) -> None:
    """Refuse to skip or resume a run directory that was made with other settings than ``wanted`` asks for.

    Args:
        wanted: the flattened config the run would get now.
        path_keys: keys holding paths, compared as :func:`config_differences` says.
        what: the sweep in the message ("sweep", "comparison").

    Raises:
        UserError: naming the first key that differs, both values, and what to do.
    """
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        return
    saved = flatten(yaml.safe_load(saved_path.read_text()) or {})
    differ = config_differences(wanted, saved, path_keys)
    if differ:
        key = differ[0]
        more = f" (and {len(differ) - 1} more keys)" if len(differ) > 1 else ""
        raise UserError(
            f"{run_dir} was run with {key}={saved[key]}, this {what} asks for {key}={wanted[key]}{more}; "
            "use another --out, or delete that run directory to redo it"
        )


def config_differences(wanted: dict, saved: dict, path_keys: tuple[str, ...] = ()) -> list[str]:
    """Keys whose values differ between the flattened config a run would get and the one it was run with.

    ``run.output_dir``: the same place, maybe spelled differently. A path (``path_keys``) to another run
    of the same ``run.output_dir`` (a pretraining, a teacher), or to a file in a folder beside it (a label
    file the sweep wrote), is compared by where it is from there, so that the sweep's folder may move;
    other paths are compared resolved. Keys the saved config lacks came with a newer sslkit: the run
    predates them, which alone is no reason to refuse it.
    """

    def place(config: dict, key: str) -> Any:
        if config[key] in (None, "null"):
            return None
        path = Path(str(config[key])).resolve()
        runs = config.get("run.output_dir")
        if runs is not None and path.parent == Path(str(runs)).resolve():
            return ("run.output_dir", path.name)
        if runs is not None and path.parent.parent == Path(str(runs)).resolve().parent:
            return ("beside run.output_dir", path.parent.name, path.name)
        return path

    def same(key: str) -> bool:
        return place(wanted, key) == place(saved, key) if key in path_keys else wanted[key] == saved[key]

    return sorted(k for k in wanted.keys() & saved.keys() if k != "run.output_dir" and not same(k))


def previous_times(path: Path, records_key: str) -> dict[str, dict[str, float | None]]:
    """The :data:`TIMES` by job name from a sweep's earlier JSON: its ``times`` (every job ever timed into this
    output; ``wall_times``, wall seconds alone, in a sweep written before CPU seconds were kept) and the
    records under ``records_key``."""
    try:
        saved = json.loads(path.read_text())
        walls = {name: {"wall_s": wall, "cpu_s": None} for name, wall in saved.get("wall_times", {}).items()}
        records = [r for r in saved[records_key] if r.get("wall_s") is not None]
        timed = {r["name"]: {key: r.get(key) for key in TIMES} for r in records}
        return {**walls, **saved.get("times", {}), **timed}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
