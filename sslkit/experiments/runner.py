"""Run an experiment's jobs on an executor, resumably, and record each one: the runner of the ablation, the
label-efficiency comparison and the recipe comparison.

A job whose result file holds its metrics is skipped ("done, skipped"); the others go to the executor
(:mod:`sslkit.experiments.executor`), which runs them where it runs them: the runner hears of each as it
starts and ends, and never learns where. A job that fails is recorded with its error line, the jobs that need
it are recorded as not run, and the others go on; a pretraining run that runs again continues from its last
checkpoint (``run.resume=auto``). The caller's tables are rewritten after every job, in the jobs' order
whatever order they ended in, and Ctrl-C stops every running job where the same command continues them. A job
stopped and continued costs what both parts cost: what it had cost when Ctrl-C stopped it is kept with the
experiment's times (marked :data:`STOPPED`), and added to the next part's when that ends.

A job's record holds its ``name``, the experiment's own ``fields``, ``status`` (ok or failed), whether it was
``skipped``, its ``error``, its cost (``wall_s``, ``cpu_s``: :data:`~sslkit.experiments.jobs.TIMES`), its
``metrics``, its ``result`` file and its ``command``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sslkit.console import console
from sslkit.errors import UserError
from sslkit.experiments.executor import Executor, Ran
from sslkit.experiments.jobs import TIMES, Job
from sslkit.schema import flatten

STOPPED = "stopped"  # in a job's times: the cost of its part that Ctrl-C stopped, which its next part adds to


def cost_after(earlier: dict | None, ran: Ran) -> dict[str, float | None]:
    """A job's :data:`TIMES` once ``ran`` has ended: its own, plus those of the job's stopped parts before it
    (``earlier``, the job's times, counts only when marked :data:`STOPPED`). A CPU time not known is None."""
    if not (earlier and earlier.get(STOPPED)):
        return {"wall_s": ran.wall_s, "cpu_s": ran.cpu_s}
    cpu_s = None if earlier.get("cpu_s") is None else earlier["cpu_s"] + ran.cpu_s
    return {"wall_s": earlier["wall_s"] + ran.wall_s, "cpu_s": cpu_s}


def record_of(job: Job, **changes: Any) -> dict:
    """A record of ``job``: that of a job that succeeded without being timed, with ``changes``."""
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
        "command": shlex.join(job.command()),
    }
    return {**record, **changes}


def ran_record(job: Job, ran: Ran, cost: dict[str, float | None]) -> dict:
    """The record of a job that ran, at ``cost`` (its :data:`TIMES`): its metrics when it wrote its result, else
    failed with its error line."""
    metrics = job.finished_metrics() if ran.status == 0 else None
    if metrics is None:
        error = ran.error or f"finished without writing {job.result.name}"
        return record_of(job, status="failed", error=error, **cost)
    return record_of(job, metrics=metrics, **cost)


def run_jobs(
    jobs: list[Job],
    out: Path,
    previous: dict[str, dict[str, float | None]],
    after_each: Callable[[list[dict]], None],
    noun: str,
    executor: Executor,
) -> list[dict] | None:
    """Skip every finished job, run the others on ``executor`` under a progress bar, and call
    ``after_each(records)`` with the records so far, in job order, after each job.

    Args:
        out: the experiment's folder; the jobs' logs go to ``out/logs``.
        previous: the :data:`~sslkit.experiments.jobs.TIMES` of jobs an earlier invocation ran, by name (skipped
            jobs keep theirs); updated with every job that runs, and with those Ctrl-C stops (:data:`STOPPED`).
        noun: what the jobs are to the user ("points", "runs"), for the progress bar and the messages.

    Returns:
        The records in job order, or None when Ctrl-C stopped the jobs (a line says how to continue).
    """
    records: dict[str, dict] = {}
    running: list[str] = []
    progress = Progress(
        TextColumn(f"[bold]{noun}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[current]}"),
        TimeElapsedColumn(),
        console=console,
    )
    task = progress.add_task(noun, total=len(jobs), current="")

    def in_order() -> list[dict]:
        return [records[job.name] for job in jobs if job.name in records]

    def add(job: Job, record: dict) -> bool:
        records[job.name] = record
        progress.console.print(
            f"{escape(f'[{len(records)}/{len(jobs)}] {job.name}')}: {outcome(record, job.shown)}",
            highlight=False,
            soft_wrap=True,
        )
        after_each(in_order())
        progress.advance(task)
        return record["status"] == "ok"

    def started(job: Job) -> None:
        running.append(job.name)
        progress.update(task, current=", ".join(running))

    def ended(job: Job, ran: Ran | None) -> bool:
        if ran is None:
            blocked = next(need for need in job.needs if records.get(need, {}).get("status") == "failed")
            return add(job, record_of(job, status="failed", error=f"not run: {blocked} failed"))
        running.remove(job.name)
        progress.update(task, current=", ".join(running))
        previous[job.name] = cost_after(previous.get(job.name), ran)
        return add(job, ran_record(job, ran, previous[job.name]))

    def stopped(job: Job, ran: Ran) -> None:
        # A job that wrote its result just before Ctrl-C came has finished: the next command skips it.
        previous[job.name] = {**cost_after(previous.get(job.name), ran), STOPPED: job.finished_metrics() is None}

    try:
        with progress:
            waiting = []
            for job in jobs:
                if (metrics := job.finished_metrics()) is None:
                    waiting.append(job)
                else:
                    times = {key: value for key, value in previous.get(job.name, {}).items() if key in TIMES}
                    add(job, record_of(job, skipped=True, metrics=metrics, **times))
            executor.run(waiting, out / "logs", started, ended, stopped)
    except KeyboardInterrupt:
        after_each(in_order())  # the stopped jobs' cost so far, kept with the times
        console.print(
            f"interrupted: the same command continues (finished {noun} are skipped, the stopped ones resume from "
            f"their last checkpoint); results so far in {out}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        return None
    return in_order()


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
