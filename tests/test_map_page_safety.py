"""The HTML map shows whatever a user's folder holds as text: no file, class or folder name runs as code.

A map is built from a real image folder whose names would break a page that pasted them in: one that
ends the data's script and starts its own, one that holds a placeholder of the page's template, one
that is an HTML element with an event handler, and quotes, ampersands, spaces and non-Latin script.
The page is then opened in headless Chromium and its DOM, as the browser built it, is read back.
"""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sslkit.cli.map import main
from sslkit.embeddings import write_embeddings
from sslkit.embeddings.html_map import script_json
from sslkit.embeddings.images import images_to_embed
from sslkit.schema import Config

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--virtual-time-budget=5000",
]  # fmt: skip

# File names (a "/" is a folder: the item's name is its path in the folder, so the first one is read as written).
HOSTILE_FILES = [
    "a</script><script>document.title='owned'</script>.png",
    "__SPRITE__.png",
    "__DATA__ __TITLE__.png",
    "é 日本.png",
    "with spaces and \"double\" and 'single' quotes.png",
    "quote\"'&.png",
    "<img src=x onerror=\"document.title='owned'\">.png",
    "line\u2028separator.png",
]
HOSTILE_CLASSES = ["<b onmouseover=\"document.title='owned'\">bold", 'amp & "quotes"']
HOSTILE_FOLDER = 'embeddings <i>__SPRITE__ & "more"'


def _labelled_folder(root: Path) -> Path:
    """``root/{train,test}/<class>/<name>``: small real PNGs, every hostile name in each class of each split."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for label, cls in enumerate(HOSTILE_CLASSES):
            for name in HOSTILE_FILES:
                path = root / split / cls / name
                path.parent.mkdir(parents=True, exist_ok=True)
                pixels = rng.integers(0, 60, (12, 12, 3), dtype=np.uint8) + np.uint8(150 * label)
                Image.fromarray(pixels).save(path, format="PNG")
    return root


class _PageText(HTMLParser):
    """What a reader sees of a page: the text of each element by id, the title, and the scripts."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.text: dict[str, list[str]] = {}
        self.title = ""
        self.scripts = 0
        self.handlers: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        ids = [value for name, value in attrs if name == "id"]
        self.stack.append(ids[0] if ids else (self.stack[-1] if self.stack else ""))
        self.scripts += tag == "script"
        self.handlers += [(tag, name) for name, _ in attrs if name.startswith("on")]
        if tag == "title":
            self.stack[-1] = "<title>"

    def handle_endtag(self, tag):
        if self.stack:
            self.stack.pop()

    def handle_data(self, data):
        where = self.stack[-1] if self.stack else ""
        self.text.setdefault(where, []).append(data)
        if where == "<title>":
            self.title += data

    def of(self, element_id: str) -> str:
        return "".join(self.text.get(element_id, []))


def test_the_script_data_holds_no_tag_entity_or_line_separator():
    text = script_json({"items": HOSTILE_FILES, "title": HOSTILE_FOLDER})
    assert not set(text) & set("<>&\u2028\u2029")
    import json

    assert json.loads(text) == {"items": HOSTILE_FILES, "title": HOSTILE_FOLDER}  # the same strings read back


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium to open the page in")
def test_a_map_of_hostile_names_shows_them_as_text_and_runs_none(tmp_path):
    root = _labelled_folder(tmp_path / "images")
    cfg = Config()
    images = images_to_embed(cfg, str(root), "train")
    assert sorted(images.classes) == sorted(HOSTILE_CLASSES) and len(images) == 16
    vectors = (np.random.default_rng(0).normal(size=(len(images), 8)) + images.labels[:, None]).astype(np.float32)
    folder = write_embeddings(
        tmp_path / HOSTILE_FOLDER, vectors, images.items, images.labels, {"data": images.describe()}
    )
    assert main([str(folder), "--out", str(tmp_path / "map"), "--k", "15"]) == 0
    page = tmp_path / "map" / "map.html"

    profile = ["--user-data-dir=" + str(tmp_path / "profile")]
    dom = subprocess.run(
        [CHROMIUM, *BROWSER_FLAGS, *profile, "--dump-dom", page.as_uri() + "#pick=0"],
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    seen = _PageText()
    seen.feed(dom)
    assert 'data-drawn="16"' in dom  # the page's own script ran to the end
    assert "owned" not in seen.title and HOSTILE_FOLDER in seen.title
    assert seen.scripts == 2 and seen.handlers == []  # the data and the page's script; no element came from a name
    picked = seen.of("picked")  # the picked item and its 15 neighbours: every row's name, as text
    for item in images.items:
        assert item in picked, item
    legend = seen.of("legend")
    for cls in HOSTILE_CLASSES:
        assert cls in legend, cls

    shot = tmp_path / "shot.png"
    subprocess.run(
        [CHROMIUM, *BROWSER_FLAGS, *profile, "--window-size=1100,700", f"--screenshot={shot}",
         page.as_uri() + "#pick=0"],
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert shot.stat().st_size > 10_000
