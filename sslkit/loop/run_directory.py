"""The run directory: checkpoints that a crash cannot harm, resume look-up, and the checks on resume.

Layout of a run directory::

    runs/<name>/
        config.yaml              the fully resolved recipe
        metrics.jsonl            one JSON object per logged step / epoch
        checkpoints/step-00000420/   accelerator.save_state + progress.json
        backbone.safetensors     the exported encoder (torchvision state_dict keys)
        results.json             final evaluation

Atomicity: a checkpoint is written into a hidden ``.tmp-step-N`` directory and renamed to
``step-N`` only after every process has finished writing (a directory rename is atomic on
POSIX). ``progress.json`` is written last, inside the temporary directory. A SIGKILL during
a save leaves a ``.tmp-*`` directory that resume ignores and the next save removes; the
last complete checkpoint is untouched. A save that fails (a full disk) removes its temporary
directory and stops the run with one line; the previous checkpoint stays as it was.

Integrity: ``checksums.json`` holds the size and SHA-256 of every file of the checkpoint. A
checkpoint damaged after it was written (a truncated copy, a bad disk) no longer matches them;
``run.resume=auto`` names it and continues from the newest checkpoint that still matches.

Loading uses ``weights_only=True`` everywhere (Accelerate's ``load_state`` does by default).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch
import yaml

from sslkit.errors import UserError
from sslkit.files import put_in_place, written_whole
from sslkit.models.weights import PROGRESS_FILE, checkpoint_dir, list_checkpoints, match_file_mode
from sslkit.schema import flatten

CHECKSUM_FILE = "checksums.json"


def resolve_resume(resume: str | None, run_dir: Path) -> tuple[Path | None, list[str]]:
    """The checkpoint ``run.resume`` names, and a line for each newer one passed over as damaged.

    ``None`` -> none; ``"auto"`` -> the run's newest intact checkpoint (none: a fresh start); a
    checkpoint -> that one, which must be intact; a run directory -> its newest intact checkpoint.
    """
    if resume is None:
        return None, []
    if resume == "auto":
        return newest_intact(run_dir)
    path = Path(resume)
    if (path / PROGRESS_FILE).is_file():
        if problem := damage(path):
            raise UserError(f"run.resume '{resume}' is damaged: {problem}; give another checkpoint of the run")
        return path, []
    if list_checkpoints(path):
        return newest_intact(path)
    raise UserError(
        f"run.resume '{resume}' is neither a checkpoint (a directory with {PROGRESS_FILE}) "
        "nor a run directory with checkpoints"
    )


def newest_intact(run_dir: Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint whose files match their checksums, and a line for each newer one that does not."""
    damaged = []
    for candidate in reversed(list_checkpoints(run_dir)):
        problem = damage(candidate)
        if problem is None:
            return candidate, damaged
        damaged.append(f"{candidate} is damaged ({problem})")
    if damaged:
        raise UserError(
            f"no intact checkpoint in {checkpoint_dir(run_dir)}: {'; '.join(damaged)}; "
            f"start the run over with another run.name (or delete {run_dir})"
        )
    return None, []


def damage(folder: Path) -> str | None:
    """What no longer matches ``checksums.json`` in a checkpoint (the first file that differs), or None.

    A checkpoint written without checksums (by an older sslkit) has nothing to check against: None.
    """
    try:
        expected = json.loads((Path(folder) / CHECKSUM_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return f"{CHECKSUM_FILE} is unreadable"
    for name, want in expected.items():
        path = Path(folder) / name
        if not path.is_file():
            return f"{name} is missing"
        if (size := path.stat().st_size) != want["bytes"]:
            return f"{name} has {size:,} of its {want['bytes']:,} bytes"
        if _sha256(path) != want["sha256"]:
            return f"{name} does not match its checksum"
    return None


def file_checksums(folder: Path) -> dict[str, dict]:
    """Size and SHA-256 of every file under ``folder`` (by relative path), but the progress and checksum files."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in (PROGRESS_FILE, CHECKSUM_FILE))
    return {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def run_contents(run_dir: Path) -> list[str]:
    """What a started or finished run left in ``run_dir`` that a second run would mix with (empty: nothing).

    A ``config.yaml`` alone (a run that stopped before its first log line) does not count.
    """
    run_dir = Path(run_dir)
    held = []
    found = list_checkpoints(run_dir)
    if found:
        held.append(f"checkpoints up to step {read_progress(found[-1])['step']}")
    held += [name for name in ("results.json", "backbone.safetensors") if (run_dir / name).is_file()]
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size:
        held.append("metrics.jsonl")
    return held


# Settings a resumed run must share with the run it continues: its checkpoint holds weights and
# optimizer state of that model, method and loss, on that data. (Anything else may change: a
# longer schedule, other evaluation settings, more logging.)
_FIXED_ON_RESUME = (
    "model.",
    "method.",
    "loss.name",
    "data.name",
    "data.holdout_classes",
    "data.label_",  # the labelled subset: label_fraction, labels_per_class, label_seed
    "data.image_size",
    "data.max_size",
    "data.sampler",  # the order a mid-epoch checkpoint counts its batches in
    "data.m_per_class",
    "augment.image_size",
    "optim.name",
    # The checkpoint's place in its epoch counts global batches of this size, and a contrastive loss's
    # negatives are the batch: another global batch would be another run. (The number of processes may
    # change: each then takes its share of the same global batch.)
    "train.batch_size",
    "train.grad_accum_steps",
)


def check_run_directory(run_dir: Path, resume: str | None, config: dict) -> list[str]:
    """Refuse a run that would mix with another in ``run_dir``; returns notes for a resumed one.

    ``config``: the new run's resolved config as a nested dict (``to_dict(cfg)``). A fresh run
    (``resume`` None) into a directory that holds a run is refused: it would append to the other
    run's metrics, leave its checkpoints beside the new ones, and a later ``run.resume=auto``
    would continue whichever checkpoint is newest. A resumed run must keep the settings of
    ``_FIXED_ON_RESUME`` that its ``config.yaml`` records; the notes list the other settings that
    changed (a longer ``train.epochs`` recomputes the learning-rate schedule for the new length).
    """
    run_dir = Path(run_dir)
    blocker = next((parent for parent in (run_dir, *run_dir.parents) if parent.exists() and not parent.is_dir()), None)
    if blocker is not None:  # mkdir would fail with a traceback at the end of the set-up
        raise UserError(
            f"the run directory {run_dir} cannot be made: {blocker} is a file; "
            "choose another run.output_dir or run.name"
        )
    if resume is None:
        held = run_contents(run_dir)
        if held:
            raise UserError(
                f"{run_dir} already holds a run ({', '.join(held)}); continue it with run.resume=auto, "
                f"or start another with run.name=<new name> (or delete {run_dir})"
            )
        return []
    saved_file = run_dir / "config.yaml"
    if resume != "auto" or not list_checkpoints(run_dir) or not saved_file.is_file():
        return []
    saved = flatten(yaml.safe_load(saved_file.read_text()) or {})  # the recorded recipe of the run being continued
    settings = flatten(yaml.safe_load(yaml.safe_dump(config)))  # through YAML too: tuples read back as lists
    changed = {
        key: (saved.get(key), settings.get(key))
        for key in sorted(saved.keys() | settings.keys())
        if key not in ("run.resume", "run.output_dir") and saved.get(key) != settings.get(key)
    }  # the same place, maybe spelled otherwise
    fixed = [key for key in changed if key.startswith(_FIXED_ON_RESUME)]
    if fixed:
        key = fixed[0]
        raise UserError(
            f"run.resume=auto continues {run_dir}, which was trained with {key}={changed[key][0]}, but this command "
            f"sets {key}={changed[key][1]}; keep {', '.join(fixed)} as they were, "
            "or start a new run with another run.name"
        )
    return (
        [
            "resuming with changed settings: "
            + ", ".join(f"{key} {old} -> {new}" for key, (old, new) in changed.items())
        ]
        if changed
        else []
    )


def trim_metrics(run_dir: Path, step: int) -> None:
    """Drop ``metrics.jsonl`` lines past ``step`` and the final evaluation's record: a resumed run logs
    them again from its checkpoint (a finished run resumed is evaluated again, an extended one at its new end)."""
    metrics = Path(run_dir) / "metrics.jsonl"
    if not metrics.is_file():
        return
    lines = metrics.read_text().splitlines()
    kept = [line for line in lines if _kept_on_resume(line, step)]
    if len(kept) != len(lines):
        metrics.write_text("".join(line + "\n" for line in kept))


def _kept_on_resume(line: str, step: int) -> bool:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:  # a line torn by a kill mid-write
        return False
    return record.get("step", 0) <= step and not any(key.startswith("final_") for key in record)


def read_progress(path: Path) -> dict:
    return json.loads((Path(path) / PROGRESS_FILE).read_text())


def save_checkpoint(accelerator, run_dir: Path, progress: dict, keep: int = 2) -> Path:
    """Save model, optimizer, scaler and RNG states of every process, atomically.

    ``progress`` holds the loop counters (``step``, ``epoch``, ``batch_in_epoch``).
    All processes must call this (each saves its own RNG state).
    """
    root = checkpoint_dir(run_dir)
    final = root / f"step-{progress['step']:08d}"
    tmp = root / f".tmp-step-{progress['step']:08d}"
    main = accelerator.is_main_process
    if main:
        for stale in root.glob(".tmp-step-*"):
            shutil.rmtree(stale, ignore_errors=True)
    failure = _attempt(lambda: tmp.mkdir(parents=True, exist_ok=True)) if main else None
    accelerator.wait_for_everyone()
    if failure is None:
        failure = _attempt(lambda: accelerator.save_state(str(tmp), safe_serialization=True))
    accelerator.wait_for_everyone()
    if main and failure is None:  # checksums of what every process wrote, then the file that marks it complete
        failure = _attempt(lambda: _seal(tmp, progress))
    # Every process learns whether any failed: one that raised alone would leave the others waiting.
    failed = accelerator.reduce(torch.tensor(float(failure is not None), device=accelerator.device), "sum")
    if failed.item():
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
        accelerator.wait_for_everyone()
        if failure is not None and not _storage_failure(failure):
            raise failure  # not the disk's doing: a bug, with its traceback
        found = list_checkpoints(run_dir)
        kept = f"the previous checkpoint {found[-1]} is intact" if found else "no earlier checkpoint exists"
        raise UserError(
            f"could not save checkpoint {final.name} in {root} ({_why(failure, root, found)}); training stopped, "
            f"{kept}; free space there (or set run.output_dir elsewhere) and continue with run.resume=auto"
        )
    if main:
        put_in_place(tmp, final)  # the same step saved twice (e.g. epoch end == step cadence): replaced
        for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def _attempt(write) -> Exception | None:
    """Run ``write``; the exception it raised, else None (raised later, once every process knows)."""
    try:
        write()
    except Exception as error:
        return error
    return None


def _storage_failure(error: Exception) -> bool:
    """Whether a write failed for the storage's sake (full, gone, read-only) rather than sslkit's.

    Only an OSError says so plainly: safetensors reports the OS error inside its own exception
    ("I/O error: No space left on device (os error 28)"), and torch.save a failed write of its zip
    container ("PytorchStreamWriter failed writing file", or "unexpected pos" when a short write
    goes unnoticed until the next record).
    """
    text = str(error)
    return isinstance(error, OSError) or any(
        sign in text for sign in ("os error", "I/O error", "PytorchStreamWriter", "unexpected pos")
    )


def _why(failure: Exception | None, root: Path, found: list[Path]) -> str:
    """Why a save failed, in words: out of space when the disk has less room than a checkpoint takes."""
    if failure is None:
        return "another process could not write its part"
    free = shutil.disk_usage(root).free if root.is_dir() else 0
    needed = sum(p.stat().st_size for p in found[-1].rglob("*") if p.is_file()) if found else 0
    if free < needed:
        return f"out of space: {free:,} bytes free there, a checkpoint takes {needed:,}"
    return f"{_one_line(failure)}; {free:,} bytes free there"


def _one_line(error: Exception) -> str:
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _seal(folder: Path, progress: dict) -> None:
    _write_atomic(folder / CHECKSUM_FILE, json.dumps(file_checksums(folder), indent=1))
    _write_atomic(folder / PROGRESS_FILE, json.dumps(progress))
    # Accelerate writes its .safetensors through safetensors' save_file, which leaves them 0600.
    for weights_file in folder.glob("*.safetensors"):
        match_file_mode(weights_file, folder / PROGRESS_FILE)


def _write_atomic(path: Path, text: str) -> None:
    with written_whole(path) as tmp, open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
