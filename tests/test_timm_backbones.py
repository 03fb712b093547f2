"""timm models as backbones: built from a recipe like sslkit's ResNets, trained by every method, exported
with timm's keys, and every mistake in the name or ``model.kwargs`` one line when the recipe loads.

The models are tiny (a 2-block ViT of width 32 on 16x16 digits: 27k parameters; a ResNet-18 with one
block a stage and 8-64 channels) so the end-to-end runs take seconds. The one-process commands run
through their ``main()`` in this process; the two-process run is a real ``accelerate launch``.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sslkit import methods, models
from sslkit.config import load_config
from sslkit.errors import UserError

timm = pytest.importorskip("timm")

PRETRAIN, EVALUATE, EXPORT = "sslkit.cli.pretrain", "sslkit.cli.evaluate", "sslkit.cli.export"

VIT = "vit_tiny_patch16_224"
VIT_KWARGS = {"img_size": 16, "patch_size": 4, "depth": 2, "embed_dim": 32, "num_heads": 2}
RESNET_KWARGS = {"layers": [1, 1, 1, 1], "channels": [8, 16, 32, 64], "stem_width": 8}


def kwargs_override(kwargs: dict) -> str:
    """``model.kwargs={img_size: 16, ...}`` as a command line spells it."""
    return "model.kwargs={" + ", ".join(f"{key}: {value}" for key, value in kwargs.items()) + "}"


TINY_VIT = [f"model.backbone={VIT}", kwargs_override(VIT_KWARGS)]
TINY_RESNET = ["model.backbone=timm/resnet18", kwargs_override(RESNET_KWARGS)]
HEADS = ["model.projector_hidden=32", "model.projector_out=16"]


# --------------------------------------------------------------------------- built from a recipe


@pytest.mark.parametrize(
    "overrides, timm_name, kwargs, dim",
    [(TINY_VIT, VIT, VIT_KWARGS, 32), (TINY_RESNET, "resnet18", RESNET_KWARGS, 64)],
)
def test_a_timm_backbone_from_a_recipe_gives_pooled_features_of_feature_dim(overrides, timm_name, kwargs, dim):
    cfg = load_config("quickstart", overrides)  # digits: grey images, 16x16 crops
    backbone = models.backbone_from_config(cfg.model, 1)
    assert isinstance(backbone, timm.models.VisionTransformer if timm_name == VIT else timm.models.ResNet)
    assert backbone.feature_dim == dim and backbone.in_channels == 1
    assert backbone(torch.randn(3, 1, 16, 16)).shape == (3, dim)
    # timm's own keys: the weights load into the model timm builds from the same arguments
    theirs = timm.create_model(timm_name, pretrained=False, num_classes=0, in_chans=1, **kwargs)
    theirs.load_state_dict(backbone.state_dict())


def test_feature_dim_is_what_forward_returns_where_a_model_has_a_pre_logits_layer():
    """MobileNetV3 pools 576 channels into a 1024-wide pre-logits layer: its features are 1024 wide."""
    with torch.device("meta"):
        backbone = models.build_timm_backbone("mobilenetv3_small_100", 3)
        assert backbone(torch.empty(2, 3, 32, 32)).shape == (2, backbone.feature_dim) == (2, 1024)


def test_sslkit_resnets_stay_the_default_and_a_timm_prefix_picks_timms():
    cfg = load_config("quickstart", ["model.backbone=resnet50", "model.width=4"])
    assert isinstance(models.backbone_from_config(cfg.model, 1), models.ScaledResNet)
    cfg = load_config("quickstart", ["model.backbone=timm/resnet50", "augment.image_size=32"])
    with torch.device("meta"):  # shapes only: a full-size ResNet-50 in no time
        backbone = models.backbone_from_config(cfg.model, 3)
    assert isinstance(backbone, timm.models.ResNet) and backbone.feature_dim == 2048
    assert models.describe(cfg.model) == "model.backbone=timm/resnet50 model.kwargs={}"


def test_width_and_stem_with_a_timm_model_are_noted():
    cfg = load_config("quickstart", TINY_VIT)  # the quick start sets model.width=16
    assert models.notes(cfg.model) == [
        "model.width=16 applies to sslkit's ResNets only; the timm model vit_tiny_patch16_224 ignores it "
        "(its own arguments go in model.kwargs)"
    ]
    assert models.notes(load_config("quickstart").model) == []


def test_loading_a_recipe_draws_no_random_numbers():
    """The check builds the model on the meta device: a run's seeded weights do not depend on it."""
    torch.manual_seed(0)
    before = torch.get_rng_state()
    load_config("quickstart", [f"model.backbone={VIT}", "model.kwargs={img_size: 16, dynamic_img_size: true}"])
    assert torch.equal(before, torch.get_rng_state())


# --------------------------------------------------------------------------- every method


@pytest.mark.parametrize(
    "method, loss",
    [
        ("simclr", "ntxent"),
        ("moco", "ntxent"),
        ("mocov3", "ntxent"),
        ("supcon", "supcon"),
        ("nce", "nce"),
        ("finetune", "softmax"),
        ("supervised", "arcface"),
    ],
)
@pytest.mark.parametrize("backbone", ["vit", "resnet"])
def test_every_method_trains_a_timm_backbone(method, loss, backbone):
    """A step of every method, channels_last on (harmless on a ViT); MoCo's SplitBatchNorm splits the
    ResNet's BatchNorm and finds none to split in the ViT (LayerNorm normalises each token alone)."""
    overrides = TINY_VIT if backbone == "vit" else TINY_RESNET
    cfg = load_config(
        "quickstart",
        [*overrides, *HEADS, f"method.name={method}", f"loss.name={loss}", "train.batch_size=8"]
        + ["method.queue_size=64", "method.num_negatives=16", "method.bn_splits=4", "model.channels_last=true"],
    )
    net = methods.build_method(cfg, models.backbone_from_config(cfg.model, 1), 10, num_samples=100)
    models.to_channels_last(net)
    views = [torch.randn(8, 1, 16, 16) for _ in range(net.num_views)]
    extra = {"indices": torch.arange(8)} if net.needs_indices else {}
    loss_value = net(*views, labels=torch.arange(8) % 10, **extra)
    loss_value.backward()
    net.after_optimizer_step(0, 10)
    assert torch.isfinite(loss_value)
    assert all(p.grad is not None for p in net.backbone.parameters())
    split = [m for m in net.modules() if type(m).__name__ == "SplitBatchNorm"]
    assert bool(split) == (method == "moco" and backbone == "resnet")
    # SplitBatchNorm keeps BatchNorm's keys: the backbone still loads into plain timm
    kwargs = VIT_KWARGS if backbone == "vit" else RESNET_KWARGS
    name = VIT if backbone == "vit" else "resnet18"
    timm.create_model(name, num_classes=0, in_chans=1, **kwargs).load_state_dict(net.backbone.state_dict())


def test_mocov3_with_a_frozen_patch_projection_trains_everything_else():
    """MoCo v3's stability trick: the patch projection keeps its random weights (in both encoders), the rest
    of the ViT and the heads learn; the predictor ends in an affine-free BatchNorm as in MoCo v3's ViT code."""
    cfg = load_config(
        "quickstart",
        [*TINY_VIT, *HEADS, "method.name=mocov3", "model.freeze_patch_embed=true", "model.projector_layers=3"]
        + ["method.predictor_hidden=32", "method.predictor_last_batch_norm=true", "train.batch_size=8"],
    )
    net = methods.build_method(cfg, models.backbone_from_config(cfg.model, 1), 10, num_samples=100)
    from sslkit.loop.build import make_optimizer

    optimizer, _ = make_optimizer(cfg, net)
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    patch = net.backbone.patch_embed.proj
    assert not {id(patch.weight), id(patch.bias)} & trained
    before = {name: p.detach().clone() for name, p in net.named_parameters()}
    net(torch.randn(8, 1, 16, 16), torch.randn(8, 1, 16, 16)).backward()
    optimizer.step()
    net.after_optimizer_step(0, 10)
    after = dict(net.named_parameters())
    assert torch.equal(after["backbone.patch_embed.proj.weight"], before["backbone.patch_embed.proj.weight"])
    assert not torch.equal(after["backbone.blocks.0.attn.qkv.weight"], before["backbone.blocks.0.attn.qkv.weight"])
    momentum_patch = dict(net.momentum_backbone.named_parameters())["patch_embed.proj.weight"]
    assert torch.equal(momentum_patch, patch.weight)
    last = net.predictor[-1]
    assert isinstance(last, torch.nn.BatchNorm1d) and not last.affine
    assert len([m for m in net.projector if isinstance(m, torch.nn.Linear)]) == 3


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["model.backbone=vit_smal_patch16_224"], ["unknown model.backbone 'vit_smal_patch16_224'", "did you mean"]),
        (["model.backbone=resnet5"], ["unknown model.backbone 'resnet5'", "did you mean resnet50"]),
        (["model.backbone=convnext_tinyy"], ["did you mean convnext_tiny", "timm.list_models()"]),
        (
            [f"model.backbone={VIT}", "model.kwargs={img_size: 16, patch_size: 5}"],
            ["patch size 5 (from model.kwargs.patch_size)", "augment.image_size=16", "2, 4, 8, 16"],
        ),
        (
            [f"model.backbone={VIT}", "augment.image_size=40", "model.kwargs={img_size: 40}"],
            ["patch size 16 (from the name vit_tiny_patch16_224) does not divide augment.image_size=40"],
        ),
        (
            [f"model.backbone={VIT}"],
            ["built for 224x224 images (its default), augment.image_size is 16", "model.kwargs.img_size=16"],
        ),
        (
            [f"model.backbone={VIT}", "model.kwargs={img_size: 16, patch_size: 4, depht: 2}"],
            ["model.kwargs.depht: timm's vit_tiny_patch16_224 takes no argument 'depht'", "remove it"],
        ),
        ([f"model.backbone={VIT}", "model.kwargs={num_classes: 10}"], ["model.kwargs.num_classes cannot be set"]),
        ([f"model.backbone={VIT}", "model.kwargs={pretrained: true}"], ["without pretrained weights", "init_from"]),
        (["model.kwargs={depth: 2}"], ["model.kwargs", "sslkit's ResNet", "model.backbone=timm/resnet18"]),
        (["model.backbone=convnext_atto"], ["convnext_atto does not run on augment.image_size=16 images"]),
        (["model.freeze_patch_embed=true"], ["model.freeze_patch_embed=true needs a patch-embedding backbone"]),
        (
            ["model.backbone=timm/resnet18", "model.freeze_patch_embed=true"],
            ["needs a model with a patch projection", "timm/resnet18 has none"],
        ),
        (
            [f"model.backbone={VIT}", "model.kwargs={img_size: 16, patch_size: 4, global_pool: ''}"],
            ["gives features of shape [17, 192]", "global_pool"],
        ),
    ],
)
def test_a_bad_backbone_is_one_line_when_the_recipe_loads(overrides, words):
    with pytest.raises(UserError) as info:
        load_config("quickstart", overrides)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


# --------------------------------------------------------------------------- end to end

SSL_TINY = ["augment.image_size=16", "train.epochs=1", "train.batch_size=64", "eval.linear_epochs=2"]
SSL_TINY += ["train.threads=1", "eval.compare_raw_pixels=false", *HEADS, *TINY_VIT]


def env() -> dict:
    e = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    e.pop("CUDA_VISIBLE_DEVICES", None)
    return e


def run(tmp_path: Path, module: str, *args: str) -> subprocess.CompletedProcess:
    """``MODULE.main(ARGS)`` in this process."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = importlib.import_module(module).main(list(args))
    result = subprocess.CompletedProcess([module, *args], status, stdout.getvalue(), stderr.getvalue())
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def trained(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())["results"]


@pytest.fixture(scope="module")
def simclr_vit(tmp_path_factory) -> Path:
    """SimCLR on the tiny ViT, one epoch on digits, with the random-init row (the backbone built a second time)."""
    out = tmp_path_factory.mktemp("vit")
    result = run(out, PRETRAIN, "quickstart", f"run.output_dir={out}", "run.name=vit", *SSL_TINY)
    assert "note: model.width=16 applies to sslkit's ResNets only" in result.stdout
    return out / "vit"


@pytest.mark.slow
def test_simclr_on_a_vit_exports_a_backbone_timm_loads(simclr_vit):
    results = trained(simclr_vit)
    assert {"knn_top1", "linear_top1"} <= set(results["trained"]) and "random init" in results
    exported = load_file(simclr_vit / "backbone.safetensors")
    theirs = timm.create_model(VIT, pretrained=False, num_classes=0, in_chans=1, **VIT_KWARGS).eval()
    theirs.load_state_dict(exported)
    # the trained network: the backbone of the run's last checkpoint, built as training builds it
    checkpoint = sorted((simclr_vit / "checkpoints").glob("step-*"))[-1]
    state = load_file(checkpoint / "model.safetensors")
    ours = models.backbone_from_config(load_config(simclr_vit / "config.yaml").model, 1).eval()
    ours.load_state_dict({k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")})
    images = torch.randn(5, 1, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(theirs(images), ours(images), rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["safetensors", "timm", "onnx"])
def test_every_export_of_a_vit_loads_back_and_reproduces_its_features(simclr_vit, tmp_path, fmt):
    """sslkit-export checks its own output; this checks it again, loading each file as its users would."""
    out = tmp_path / {"safetensors": "vit.safetensors", "timm": "vit-timm", "onnx": "vit.onnx"}[fmt]
    result = run(tmp_path, EXPORT, str(simclr_vit), "--format", fmt, "--out", str(out))
    assert "loaded back" in result.stdout and out.exists() and not list(tmp_path.glob("*.tmp"))
    ours = models.backbone_from_config(load_config(simclr_vit / "config.yaml").model, 1).eval()
    ours.load_state_dict(load_file(simclr_vit / "backbone.safetensors"))
    images = torch.randn(4, 1, 16, 16)
    if fmt == "safetensors":
        theirs = timm.create_model(VIT, pretrained=False, num_classes=0, in_chans=1, **VIT_KWARGS).eval()
        theirs.load_state_dict(load_file(out))
    elif fmt == "timm":
        theirs = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    else:
        import onnxruntime

        session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        assert session.get_inputs()[0].name == "images" and session.get_outputs()[0].name == "features"

        def theirs(x):
            return torch.from_numpy(session.run(None, {"images": x.numpy()})[0])

    with torch.no_grad():
        torch.testing.assert_close(theirs(images), ours(images), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_vit_run_fine_tunes_from_init_from_and_evaluates(simclr_vit, tmp_path):
    finetune = ["data.label_fraction=0.1", "train.epochs=1", "train.batch_size=16", "optim.warmup_epochs=0"]
    result = run(
        tmp_path,
        PRETRAIN,
        "quickstart_finetune",
        f"run.output_dir={tmp_path}",
        "run.name=ft",
        f"run.init_from={simclr_vit}",
        "train.threads=1",
        "eval.linear_epochs=0",
        *TINY_VIT,
        *finetune,
    )
    assert f"backbone initialised from {simclr_vit}" in result.stdout
    assert "finetune_top1" in trained(tmp_path / "ft")["trained"]
    out = tmp_path / "eval.json"
    run(tmp_path, EVALUATE, str(simclr_vit), "--no-linear", "eval.knn_k=5", "--out", str(out))
    assert 0.0 <= json.loads(out.read_text())["results"]["knn_top1"] <= 1.0


@pytest.mark.slow
def test_mocov3_trains_a_vit(tmp_path):
    args = ["quickstart", f"run.output_dir={tmp_path}", "run.name=v3", *SSL_TINY, "method.name=mocov3"]
    run(tmp_path, PRETRAIN, *args, "train.max_steps=4", "eval.linear_epochs=0", "method.predictor_hidden=32")
    steps = [json.loads(line) for line in (tmp_path / "v3" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "loss" in r][-1] == 4
    assert "knn_top1" in trained(tmp_path / "v3")["trained"]


@pytest.mark.slow
def test_two_processes_on_a_vit_resume_exactly(tmp_path):
    """Six steps in two processes; the same run resumed from its step-2 checkpoint ends with the same weights
    and logs the same losses for steps 3 to 6."""
    from dist_utils import run_as_ranks

    def two_processes(*args: str) -> subprocess.CompletedProcess:
        result = run_as_ranks([sys.executable, "-m", PRETRAIN, *args], env=env(), cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    args = ["quickstart", f"run.output_dir={tmp_path}", *SSL_TINY, "train.max_steps=6", "eval.linear_epochs=0"]
    args += ["train.checkpoint_every_steps=2", "train.keep_checkpoints=5", "train.log_every_steps=1"]
    args += ["eval.compare_random_init=false"]
    straight = two_processes(*args, "run.name=straight")
    assert "2 processes" in straight.stdout
    # The same run, as if stopped after its step-2 checkpoint.
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    for later in ("step-00000004", "step-00000006"):
        shutil.rmtree(tmp_path / "resumed" / "checkpoints" / later)
    for name in ("backbone.safetensors", "results.json", "report.md"):
        (tmp_path / "resumed" / name).unlink(missing_ok=True)
    resumed = two_processes(*args, "run.name=resumed", "run.resume=auto")
    assert "resumed from" in resumed.stdout and "step 2" in resumed.stdout

    def losses(name: str) -> list[tuple[int, float]]:
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [(r["step"], r["loss"]) for r in map(json.loads, lines) if "loss" in r]

    # steps 3 to 6 logged once, by the resumed run, with the losses of the run that never stopped
    assert losses("resumed") == losses("straight") and [step for step, _ in losses("resumed")] == [1, 2, 3, 4, 5, 6]
    straight_weights = load_file(tmp_path / "straight" / "backbone.safetensors")
    resumed_weights = load_file(tmp_path / "resumed" / "backbone.safetensors")
    assert straight_weights.keys() == resumed_weights.keys()
    for key in straight_weights:
        assert torch.equal(straight_weights[key], resumed_weights[key]), key
