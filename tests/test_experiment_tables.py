"""sslkit.experiments.tables: an experiment's CSV and JSON files are written whole or not at all, so that a
second Ctrl-C while they are rewritten leaves the last whole version."""

from __future__ import annotations

import csv
import json

import pytest

from sslkit.experiments.tables import write_csv, write_json


def test_a_csv_file_is_written_whole_or_the_old_one_stays(tmp_path):
    path = tmp_path / "summary.csv"
    write_csv(path, ["road", "top1"], [["finetune", "0.8"], ["scratch", "0.7"]])
    assert list(csv.reader(path.open())) == [["road", "top1"], ["finetune", "0.8"], ["scratch", "0.7"]]

    def rows_then_stop():
        yield ["fixmatch", "0.9"]
        raise KeyboardInterrupt  # as a Ctrl-C halfway through the rows

    with pytest.raises(KeyboardInterrupt):
        write_csv(path, ["road", "top1"], rows_then_stop())
    assert list(csv.reader(path.open())) == [["road", "top1"], ["finetune", "0.8"], ["scratch", "0.7"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.csv"]  # no temporary file left


def test_a_json_file_is_written_whole_or_the_old_one_stays(tmp_path):
    path = tmp_path / "points.json"
    write_json(path, {"times": {"a": {"wall_s": 1.0}}})
    assert json.loads(path.read_text()) == {"times": {"a": {"wall_s": 1.0}}}
    with pytest.raises(TypeError):
        write_json(path, {"times": object()})
    assert json.loads(path.read_text()) == {"times": {"a": {"wall_s": 1.0}}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["points.json"]
