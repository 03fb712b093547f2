"""Terminal output with rich: the resolved config, result tables, one-line errors; whole lines in a log."""

from __future__ import annotations

import os

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()
# Into a log file or a pipe, each printed line goes whole: rich would fold it at 80 columns, mid-word inside a
# long path, and grep or a parser of the log would miss it. A terminal keeps rich's wrapping at its width.
console.soft_wrap = not console.is_terminal
error_console = Console(stderr=True)


def print_config(config_dict: dict, defaults: dict, title: str, saved_at: str) -> None:
    """The settings that differ from sslkit's defaults, one line per section, and where the full config went.

    The whole resolved config is about 150 lines; a reader of a log wants what this run chose.
    """
    console.rule(f"[bold]{title}")
    changed: dict[str, list[str]] = {}
    for key, value in config_dict.items():
        if key not in defaults or defaults[key] != value:
            section, name = key.split(".", 1)
            changed.setdefault(section, []).append(f"{name}={yaml.safe_dump(value, default_flow_style=True).strip()}")
    for section, settings in changed.items():
        # trailing "..." is safe_dump's end-of-document marker for a bare scalar
        console.print(f"[bold]{section}[/]: " + escape(", ".join(settings).replace("\n...", "")), highlight=False)
    console.print(f"(other settings at their defaults; the full config is in {escape(saved_at)})", highlight=False)


def results_table(rows: dict[str, dict[str, float]], title: str = "results") -> Table:
    """One row per metric, one column per encoder (e.g. "trained", "random init").

    Metrics go down rather than across: a run with retrieval has a dozen of them, and a table
    that wide is cut to unreadable stubs in an 80-column log.
    """
    metrics = list(dict.fromkeys(m for values in rows.values() for m in values))
    # A title wider than the columns would wrap (or be cut) in an 80-column log: let it set the width.
    table = Table(title=title, min_width=min(len(title), console.width))
    table.add_column("metric")
    for name in rows:
        table.add_column(name, justify="right")
    for metric in metrics:
        table.add_row(metric, *(f"{values[metric]:.4f}" if metric in values else "-" for values in rows.values()))
    return table


def print_table(table: Table) -> None:
    """Print ``table`` at its own width when the terminal (or a log's 80 columns) is narrower.

    rich otherwise squeezes the columns to fit, and a summary of mean ± std over seeds comes out
    as ``0.…`` in every cell; a long line in a log file still reads, a cut number does not.
    """
    needed = console.measure(table, options=console.options.update_width(1000)).maximum
    width = console.width
    console.width = max(width, needed)  # not print(width=...): rich clamps that to the console's width
    try:
        console.print(table)
    finally:
        console.width = width


def print_user_error(error: Exception) -> None:
    """One line, no traceback: a user's mistake, and what to do about it."""
    message = str(error).strip()
    if "\n" in message:
        # Raised in a DataLoader worker: PyTorch re-raises it with the worker's traceback in the
        # message; the user's line is the last one.
        message = message.splitlines()[-1].split("UserError: ", 1)[-1]
    if "ACCELERATE_DYNAMO_BACKEND" in os.environ:  # set by accelerate launch in the processes it starts
        # Its launcher answers any exit status but 0 with a traceback of its own, after this line.
        message += " (accelerate launch prints a traceback of this exit status next; accelerate launch -q does not)"
    error_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
