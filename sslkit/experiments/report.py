"""A Markdown report of one run: its config, final metrics and training curves.

``write_report(run_dir)`` reads what a run leaves on disk (``config.yaml``, ``metrics.jsonl``,
``results.json``) and writes ``run_dir/report.md``. With matplotlib installed (the ``plot``
extra) the curves are PNGs next to the report:

- ``report-loss.png``: training loss against the optimizer step;
- ``report-lr.png``: learning rate against the step;
- ``report-knn_top1.png``: the kNN monitor's top-1 against the epoch (the final evaluation is
  its last point).

Without matplotlib the same curves are sampled text tables, and the report says how to get
the plots. A run still training, or one that stopped before its final evaluation, gets a
partial report: whatever has been logged so far.

matplotlib is drawn through its object-oriented ``Figure`` API, never ``pyplot``: that needs
no display, and it leaves the backend of a notebook that calls :func:`write_report` alone.

>>> write_report(Path("runs/quickstart"))  # doctest: +SKIP
PosixPath('runs/quickstart/report.md')
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from sslkit.embeddings import read_embeddings
from sslkit.embeddings.maps import draw_pictures
from sslkit.errors import UserError, install_hint

PLOT_HINT = f"`{install_hint('plot')}` adds the plots (matplotlib)."
TEXT_TABLE_ROWS = 20  # rows a text table keeps when matplotlib is missing


def have_matplotlib() -> bool:
    """Whether the optional ``plot`` extra is installed."""
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError:
        return False
    return True


def new_figure(width: float = 6.0, height: float = 4.0, panels: int = 1) -> Any:
    """A matplotlib ``Figure`` with ``panels`` sets of axes side by side, sharing their y axis
    (``figure.axes[0]`` the first), or None without matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    figure = Figure(figsize=(width, height), layout="constrained")
    if panels == 1:
        figure.add_subplot()
    else:
        figure.subplots(1, panels, sharey=True)
    return figure


def read_metrics(path: Path) -> list[dict]:
    """The records of a ``metrics.jsonl``, skipping a line a running trainer has half written."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def is_run_dir(path: Path) -> bool:
    """A run directory is one the trainer has started writing: it has a ``config.yaml``."""
    return (path / "config.yaml").is_file()


def write_report(run_dir: Path) -> Path:
    """Write ``run_dir/report.md`` (and its PNG curves when matplotlib is installed).

    Args:
        run_dir: a run directory, as ``sslkit-pretrain`` writes it.

    Returns:
        The path of the report.

    Raises:
        UserError: ``run_dir`` is not a run directory (it has no ``config.yaml``).
    """
    run_dir = Path(run_dir)
    if not is_run_dir(run_dir):
        raise UserError(
            f"'{run_dir}' is not a run directory (no config.yaml); "
            "give one that sslkit-pretrain wrote, e.g. runs/quickstart"
        )
    records = read_metrics(run_dir / "metrics.jsonl")
    steps = [r for r in records if "loss" in r]
    knn = _knn_points(records)
    results = _read_results(run_dir / "results.json")

    sections = [f"# Run report: {run_dir.name}", "", f"`{run_dir}`: {_status_line(records, results)}", ""]
    sections += ["## Final metrics", ""]
    if results is not None:
        names = _metric_names(results["results"])
        sections += [
            _markdown_table(
                ["encoder", *names],
                [[encoder, *_cells(values, names)] for encoder, values in results["results"].items()],
            ),
            "",
        ]
    else:
        sections += [
            "No `results.json` yet: the run is still training, or it stopped before its final evaluation.",
            "",
        ]
    if steps:
        sections += ["## Training", "", _training_summary(steps), ""]
    sections += ["## Curves", "", *_curves(run_dir, steps, knn), ""]
    if embedded := sorted(folder for folder in run_dir.glob("embeddings-*") if (folder / "meta.json").is_file()):
        sections += ["## Embeddings", "", *_embedding_pictures(embedded), ""]
    sections += ["## Config", "", "```yaml", (run_dir / "config.yaml").read_text().rstrip(), "```", ""]
    path = run_dir / "report.md"
    path.write_text("\n".join(sections))
    return path


def _embedding_pictures(folders: list[Path]) -> list[str]:
    """The map and neighbour grid of each embeddings folder in the run (``sslkit-embed``'s default place),
    drawn by ``sslkit-map``'s defaults where the folder has none yet."""
    lines = []
    for folder in folders:
        try:
            embeddings = read_embeddings(folder)
            if have_matplotlib() and not (folder / "map.png").is_file():
                draw_pictures(embeddings, folder, sample=2000)
        except UserError as error:  # an unfinished folder, or its images gone: said, and the report goes on
            lines += [f"- `{folder.name}`: {error}", ""]
            continue
        shape = f"{len(embeddings)} rows of {embeddings.meta.get('dimension')} dimensions"
        link = f"[the interactive map]({folder.name}/map.html)"
        lines += [f"### {folder.name}", "", f"{shape} ({embeddings.meta.get('layer', 'backbone')}); {link}", ""]
        if not have_matplotlib():
            lines += [PLOT_HINT, ""]
            continue
        lines += [f"![map of {folder.name}]({folder.name}/map.png)", ""]
        if (folder / "neighbours.png").is_file():
            lines += [f"![nearest neighbours in {folder.name}]({folder.name}/neighbours.png)", ""]
    return lines


# --------------------------------------------------------------------------- reading


def _read_results(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        results = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None  # being written right now: report as unfinished
    return results if isinstance(results.get("results"), dict) else None


def _knn_points(records: list[dict]) -> list[tuple[int, int, float, bool]]:
    """(epoch, step, kNN top-1, is_final) from the epoch monitor and the final evaluation."""
    points = [(r["epoch"], r["step"], r["knn_top1"], False) for r in records if "knn_top1" in r]
    points += [(r["epoch"], r["step"], r["final_knn_top1"], True) for r in records if "final_knn_top1" in r]
    return points


def _status_line(records: list[dict], results: dict | None) -> str:
    if results is not None:
        return f"finished at step {results.get('step', '?')}."
    if not records:
        return "started; nothing logged yet."
    last = records[-1]
    return f"unfinished; last logged step {last.get('step', '?')} (epoch {last.get('epoch', '?')})."


def _metric_names(rows: dict[str, dict]) -> list[str]:
    names = {m for values in rows.values() for m in values}
    return sorted(names, key=lambda m: (m not in ("knn_top1", "linear_top1"), m))


# --------------------------------------------------------------------------- text


def _cells(values: dict, names: list[str]) -> list[str]:
    return [_format(values[m]) if m in values else "-" for m in names]


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) >= 1e4 or (value != 0 and abs(value) < 1e-3) else f"{value:.4f}"
    return str(value)


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _training_summary(steps: list[dict]) -> str:
    rows = [
        ["steps logged", str(len(steps))],
        ["last step", str(steps[-1]["step"])],
        ["last loss", _format(steps[-1]["loss"])],
    ]
    # Medians: the first window includes start-up, and a checkpoint or kNN pass slows one window.
    for key, label, style in (
        ("images_per_s", "median images/s", "{:.0f}"),
        ("data_wait_share", "median data-wait share", "{:.1%}"),
    ):
        values = [r[key] for r in steps if isinstance(r.get(key), (int, float))]
        if values:
            rows.append([label, style.format(statistics.median(values))])
    return _markdown_table(["", "value"], rows)


def _sample(rows: list, count: int) -> list:
    """At most ``count`` rows, evenly spaced, always keeping the first and the last."""
    if len(rows) <= count:
        return rows
    picks = sorted({round(i * (len(rows) - 1) / (count - 1)) for i in range(count)})
    return [rows[i] for i in picks]


# --------------------------------------------------------------------------- curves


def _curves(run_dir: Path, steps: list[dict], knn: list[tuple[int, int, float, bool]]) -> list[str]:
    if not steps and not knn:
        return ["Nothing logged yet."]
    if not have_matplotlib():
        return _text_curves(steps, knn)
    lines = []
    if steps:
        xs = [r["step"] for r in steps]
        lines.append(_plot(run_dir / "report-loss.png", xs, [r["loss"] for r in steps], "step", "training loss"))
        lines.append(_plot(run_dir / "report-lr.png", xs, [r["lr"] for r in steps], "step", "learning rate"))
    if knn:
        lines.append(
            _plot(
                run_dir / "report-knn_top1.png",
                [p[0] for p in knn],
                [p[2] for p in knn],
                "epoch",
                "kNN top-1",
                marker="o",
            )
        )
    else:
        lines.append("No kNN records yet (the first monitored epoch has not ended, or `train.knn_every_epochs` is 0).")
    return lines


def _plot(path: Path, xs: list, ys: list, xlabel: str, ylabel: str, marker: str | None = None) -> str:
    figure = new_figure()
    axes = figure.axes[0]
    axes.set_title(path.parent.name)
    axes.plot(xs, ys, marker=marker)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    figure.savefig(path, dpi=100)
    return f"![{ylabel} vs {xlabel}]({path.name})"


def _text_curves(steps: list[dict], knn: list[tuple[int, int, float, bool]]) -> list[str]:
    lines = [f"_Plots need matplotlib: {PLOT_HINT}_", ""]
    if steps:
        sampled = _sample(steps, TEXT_TABLE_ROWS)
        shown = (
            f"{len(sampled)} of {len(steps)} logged steps, evenly spaced"
            if len(sampled) < len(steps)
            else "every logged step"
        )
        lines += [f"Loss and learning rate ({shown}):", ""]
        lines += [
            _markdown_table(
                ["step", "epoch", "loss", "lr"],
                [[str(r["step"]), str(r.get("epoch", "")), _format(r["loss"]), f"{r['lr']:.3g}"] for r in sampled],
            ),
            "",
        ]
    if knn:
        lines += ["kNN top-1:", ""]
        lines += [
            _markdown_table(
                ["epoch", "step", "knn_top1"],
                [
                    [str(e) + (" (final)" if final else ""), str(s), _format(v)]
                    for e, s, v, final in _sample(knn, TEXT_TABLE_ROWS)
                ],
            )
        ]
    else:
        lines.append("No kNN records yet (the first monitored epoch has not ended, or `train.knn_every_epochs` is 0).")
    return lines
