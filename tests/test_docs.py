"""The loss table in docs/losses.md is generated from the code and must be current."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_loss_table_is_up_to_date():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "loss_table.py"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_registered_loss_is_in_the_readme_or_docs():
    from sslkit.losses import LOSSES

    text = (ROOT / "docs" / "losses.md").read_text()
    for name in LOSSES:
        assert f"`{name}`" in text, name
