"""Terminal output: tables too wide for a log's 80 columns keep their numbers whole."""

from __future__ import annotations

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
