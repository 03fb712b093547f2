"""Trackers get the metrics and the resolved config; a compiled method trains, resumes exactly and fails in one
line; a non-finite loss stops the run whether it is read at once (CPU) or counted on the device."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file

from sslkit.config import load_config
from sslkit.errors import UserError
from sslkit.loop import train
from sslkit.loop.build import make_accelerator
from sslkit.loop.state import LoopState
from sslkit.loop.step import FiniteLoss

TINY = ["train.batch_size=32", "train.threads=1", "eval.linear_epochs=0", "eval.compare_random_init=false"]
TINY += ["eval.compare_raw_pixels=false", "model.projector_hidden=32", "train.log_every_steps=1"]
# timm's ResNet-18 with one block a stage, 8 to 64 channels: compiles in seconds
TINY_RESNET = ["model.backbone=timm/resnet18", "model.kwargs={layers: [1, 1, 1, 1], channels: [8, 16, 32, 64]}"]


def run(tmp_path, name: str, *overrides: str) -> dict:
    train(load_config("quickstart", [f"run.output_dir={tmp_path}", f"run.name={name}", *TINY, *overrides]))
    return json.loads((tmp_path / name / "results.json").read_text())["results"]


def wandb_values(run_dir, key: str) -> list[str]:
    """The JSON values W&B's offline run file holds for ``key`` (config items and history rows alike are
    protobuf ``(key, value_json)`` pairs: length-prefixed key, then field 16 with the JSON text)."""
    (record,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    blob, name = wandb_records(record.read_bytes()), key.encode()
    pattern = re.escape(bytes([len(name)]) + name) + rb"\x82\x01(.)"
    values = []
    for match in re.finditer(pattern, blob, flags=re.DOTALL):
        start = match.end()
        values.append(blob[start : start + match.group(1)[0]].decode())
    return values


@pytest.mark.slow
def test_tensorboard_and_wandb_get_the_metrics_and_the_resolved_config(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    results = run(tmp_path, "tracked", "train.max_steps=3", "train.trackers=[tensorboard, wandb]")
    run_dir = tmp_path / "tracked"
    losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()[:3]]

    events = EventAccumulator(str(run_dir / "sslkit")).Reload()
    assert [round(e.value, 4) for e in events.Scalars("loss")] == [round(v, 4) for v in losses]
    (hparams,) = run_dir.glob("sslkit/*/hparams.yml")
    assert "augment.crop_scale: '[0.3, 1.0]'" in hparams.read_text()

    # W&B's writer process may still be flushing the run file when the run returns: wait for its last record.
    deadline = time.monotonic() + 60
    while not wandb_values(run_dir, "final_knn_top1") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert wandb_values(run_dir, "augment.crop_scale") == ['"[0.3, 1.0]"']  # config, as TensorBoard got it
    assert wandb_values(run_dir, "train.max_steps") == ["3"]
    # every logged row is in the file twice: as a history row and as the run summary's update
    assert [float(v) for v in wandb_values(run_dir, "loss")[::2]] == pytest.approx(losses)
    assert float(wandb_values(run_dir, "final_knn_top1")[0]) == pytest.approx(results["trained"]["knn_top1"])


@pytest.mark.slow
def test_a_methods_own_figures_reach_the_trackers_as_the_log_has_them(tmp_path):
    """FixMatch's mask rate and its two terms (from forward) and its EMA decay (from the step after) go to TensorBoard
    with the loss."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    fixmatch = ["model.width=4", "augment.image_size=8", "train.batch_size=8", "method.mu=3", "train.max_steps=3"]
    fixmatch += ["train.trackers=[tensorboard]", "run.name=fixmatch", f"run.output_dir={tmp_path}", *TINY[1:]]
    train(load_config("quickstart_fixmatch", fixmatch))
    run_dir = tmp_path / "fixmatch"
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()[:3]]
    events = EventAccumulator(str(run_dir / "sslkit")).Reload()
    for name in ("mask_rate", "supervised_loss", "unlabelled_loss", "ema_decay", "loss"):
        assert [e.value for e in events.Scalars(name)] == pytest.approx([r[name] for r in logged]), name


def wandb_records(blob: bytes) -> bytes:
    """The records of a W&B run file with their chunk headers taken out: the file is a LevelDB-style log (a
    7-byte file header, then 32 KiB blocks of chunks, each a 7-byte header: CRC, little-endian length, type),
    and a record that crosses a block boundary is split in two chunks."""
    records, position, block = bytearray(), 7, 32768
    while position + 7 <= len(blob):
        if block - position % block < 7:  # too little room for a header: the writer padded to the next block
            position += block - position % block
            continue
        length = int.from_bytes(blob[position + 4 : position + 6], "little")
        records += blob[position + 7 : position + 7 + length]
        position += 7 + length
    return bytes(records)


@pytest.mark.slow
def test_a_resumed_run_continues_its_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    common = ["train.trackers=[wandb]", "train.checkpoint_every_steps=2"]
    run(tmp_path, "tracked", "train.max_steps=2", *common)
    run(tmp_path, "tracked", "train.max_steps=4", "run.resume=auto", *common)
    run_id = (tmp_path / "tracked" / "wandb_id.txt").read_text().strip()
    # W&B's offline folders are offline-run-<time>-<id>, with -<n> added when two starts share a second:
    # one per start, both with the run's id
    folders = sorted((tmp_path / "tracked" / "wandb").glob("offline-run-*"))
    named = re.compile(rf"offline-run-\d{{8}}_\d{{6}}-{re.escape(run_id)}(-\d+)?")
    assert len(folders) == 2 and all(named.fullmatch(f.name) for f in folders), folders


@pytest.mark.slow
def test_a_compiled_method_trains_like_the_eager_one_and_resumes_exactly(tmp_path):
    """aot_eager traces forward and backward as inductor does, without its code generation (tens of seconds
    of C++ compilation per graph on this CPU); the bench measures inductor's speed."""
    common = ["train.max_steps=4", "train.checkpoint_every_steps=2", "train.keep_checkpoints=3", *TINY_RESNET]
    compiled = ["train.compile=true", "train.compile_backend=aot_eager"]
    from torch._dynamo.utils import counters  # dynamo's own statistics: proof that a graph was compiled

    run(tmp_path, "eager", *common)
    counters.clear()
    run(tmp_path, "straight", *common, *compiled)
    assert counters["stats"]["unique_graphs"] >= 1

    def losses(name: str) -> list[float]:
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if "loss" in r]

    assert losses("straight") == pytest.approx(losses("eager"), rel=1e-4)
    # stopped after its step-2 checkpoint, then resumed (compiled again)
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step-00000004")
    for name in ("backbone.safetensors", "results.json"):
        (tmp_path / "resumed" / name).unlink()
    run(tmp_path, "resumed", *common, *compiled, "run.resume=auto")
    assert losses("resumed") == losses("straight")
    straight, resumed = (load_file(tmp_path / name / "backbone.safetensors") for name in ("straight", "resumed"))
    assert all(torch.equal(straight[key], resumed[key]) for key in straight)
    # checkpoints hold the method's own keys, not the compiled wrapper's
    state = load_file(tmp_path / "straight" / "checkpoints" / "step-00000004" / "model.safetensors")
    assert "backbone.conv1.weight" in state and not any("_orig_mod" in key for key in state)


def test_a_failing_compile_is_one_line(tmp_path):
    """A backend that cannot compile (torch's tvm backend without the tvm package) stops the run at its first
    step with what failed and how to train without compiling; a backend torch does not know, when loaded."""
    if importlib.util.find_spec("tvm") is not None:
        pytest.skip("tvm is installed: its backend compiles")
    with pytest.raises(UserError) as info:
        run(tmp_path, "bad", "train.max_steps=1", "train.compile=true", "train.compile_backend=tvm")
    line = str(info.value)
    assert "train.compile: torch.compile (backend tvm) failed" in line and "train.compile=false" in line
    assert "\n" not in line
    with pytest.raises(UserError, match="train.compile_backend.*inductor"):
        load_config("quickstart", ["train.compile=true", "train.compile_backend=fast"])


@pytest.mark.parametrize("eager", [True, False])
def test_a_non_finite_loss_stops_the_run_whether_read_at_once_or_counted_on_the_device(eager):
    """On the CPU the loss is read at once; on an accelerator it is counted on the device and read at log lines
    (forced here on the CPU: the same code, without the GPU this machine lacks)."""
    cfg = load_config("quickstart", ["train.max_steps=1"])
    finite = FiniteLoss(make_accelerator(cfg))
    finite.eager = eager
    progress = LoopState(step=7, epoch=1)
    finite.add(torch.tensor(1.0), progress)
    finite.check(progress)
    with pytest.raises(UserError) as info:
        finite.add(torch.tensor(float("nan")), progress)
        finite.add(torch.tensor(float("inf")), progress)
        finite.check(progress)
    expected = "loss became nan" if eager else "the loss was not finite in 2 batches"
    assert f"{expected} at step 7 (epoch 1); training stopped, no checkpoint was written yet" in str(info.value)
