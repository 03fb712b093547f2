"""BYOL, SimSiam, Barlow Twins and VICReg: each forward is its loss on the right tensors (against the
paper's formula, in float64), with multi-crop's local views too, what trains and what does not, the recipe
mistakes, and one run on digits that resumes exactly and exports.

Everything runs a width-4 ResNet-18 on scikit-learn's 8x8 digits so the file stays fast on two cores.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from sklearn.datasets import load_digits

from sslkit import methods, optim
from sslkit.cli.export import export
from sslkit.config import config_from_dict, load_config
from sslkit.errors import UserError
from sslkit.loop import train
from sslkit.models import build_backbone

BATCH = 16
NAMES = ["byol", "simsiam", "barlow_twins", "vicreg"]


@pytest.fixture(autouse=True)
def one_thread():
    """These tensors are tiny: with 2 threads on a busy 2-core machine, OpenMP hand-offs slow each step."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def fixed_views(n: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Two fixed "views" of n digits: the images and their mirror images, each with a little noise."""
    pixels, _ = load_digits(return_X_y=True)
    images = torch.tensor(pixels[:n], dtype=torch.float32).view(n, 1, 8, 8) / 16
    noise = torch.Generator().manual_seed(1)
    return (
        images + 0.05 * torch.randn(images.shape, generator=noise),
        images.flip(3) + 0.05 * torch.randn(images.shape, generator=noise),
    )


def build(name: str, seed: int = 0, **method_options):
    """A tiny method by registry name, with the loss of the same name."""
    torch.manual_seed(seed)
    options = {"predictor_hidden": 8} if name in ("byol", "simsiam") else {}
    cfg = config_from_dict(
        {
            "method": {"name": name, **options, **method_options},
            "model": {"width": 4, "projector_hidden": 32, "projector_out": 16},
            "loss": {"name": name},
            "train": {"batch_size": BATCH},
        }
    )
    return methods.build_method(cfg, build_backbone("resnet18", 4, True, 1), 10)


def grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


# --------------------------------------------------------------------------- each forward is its loss


def test_byol_is_the_summed_normalised_mse_of_each_prediction_against_the_other_views_target():
    method = build("byol").double()
    view1, view2 = (v.double() for v in fixed_views())
    method(view1, view2).backward()
    by_method = grads(method)
    method.zero_grad()
    q = method.predictor(method.projector(method.backbone(torch.cat([view1, view2]))))
    with torch.no_grad():  # the target network's projections: constants
        z = method.momentum_projector(method.momentum_backbone(torch.cat([view1, view2])))
    q1, q2, z1, z2 = *q.chunk(2), *z.chunk(2)

    def normalised_mse(queries, targets):  # eq. 2 of BYOL, one image at a time
        terms = [(F.normalize(qi, dim=0) - F.normalize(ti, dim=0)).square().sum() for qi, ti in zip(queries, targets)]
        return torch.stack(terms).mean()

    expected = normalised_mse(q1, z2) + normalised_mse(q2, z1)  # L + L~, summed as the paper trains
    expected.backward()
    torch.testing.assert_close(method(view1, view2), expected)
    assert by_method.keys() == grads(method).keys()
    for name, grad in grads(method).items():
        torch.testing.assert_close(by_method[name], grad, msg=name)


def test_byol_target_gets_no_gradient_and_moves_by_the_momentum_rule_after_the_step():
    method = build("byol", momentum=0.9, momentum_final=1.0)
    optimizer = optim.build_optimizer("sgd", optim.parameter_groups(method, 0.0, False), lr=0.1, momentum=0.0)
    method(*fixed_views()).backward()
    target = {n: p for n, p in method.named_parameters() if n.startswith("momentum_")}
    assert target and all(p.grad is None and not p.requires_grad for p in target.values())
    assert not {n for g in optim.parameter_groups(method, 0.0, False) for n in g["names"]} & set(target)
    before = {n: p.detach().clone() for n, p in target.items()}
    optimizer.step()
    assert all(torch.equal(before[n], p) for n, p in target.items())  # the step itself leaves the target alone
    online = dict(method.named_parameters())
    m = optim.cosine_momentum(3, 10, 0.9, 1.0)
    assert method.after_optimizer_step(3, 10) == {"momentum": m}  # what the log shows
    for name, param in target.items():
        expected = m * before[name] + (1 - m) * online[name.removeprefix("momentum_")]
        torch.testing.assert_close(param, expected, msg=name)


def test_simsiam_stops_the_gradient_through_the_projections_and_has_no_momentum_encoder():
    method = build("simsiam").double()
    assert not any(n.startswith("momentum_") for n, _ in method.named_parameters())
    view1, view2 = (v.double() for v in fixed_views())
    method(view1, view2).backward()
    by_method = grads(method)
    method.zero_grad()
    z = method.projector(method.backbone(torch.cat([view1, view2])))
    p1, p2 = method.predictor(z).chunk(2)
    z1, z2 = z.detach().chunk(2)

    def negative_cosine(p, target):  # D(p, z) of SimSiam, one image at a time
        return torch.stack([-(F.normalize(pi, dim=0) @ F.normalize(ti, dim=0)) for pi, ti in zip(p, target)]).mean()

    expected = negative_cosine(p1, z2) / 2 + negative_cosine(p2, z1) / 2
    expected.backward()
    torch.testing.assert_close(method(view1, view2), expected)
    for name, grad in grads(method).items():
        torch.testing.assert_close(by_method[name], grad, msg=name)
    assert by_method.keys() == grads(method).keys()


def test_barlow_twins_is_the_cross_correlation_loss_of_the_standardised_projections():
    method = build("barlow_twins").double()
    view1, view2 = (v.double() for v in fixed_views())
    z1, z2 = method.projector(method.backbone(torch.cat([view1, view2]))).chunk(2)
    n, d = z1.shape
    standardised = [(z - z.mean(0)) / torch.sqrt(z.var(0, unbiased=False) + 1e-5) for z in (z1, z2)]
    expected = torch.zeros((), dtype=torch.float64)
    for i in range(d):  # eq. 1 and 2 of Barlow Twins, term by term
        for j in range(d):
            c_ij = sum(standardised[0][b, i] * standardised[1][b, j] for b in range(n)) / n
            expected = expected + ((1 - c_ij) ** 2 if i == j else 5e-3 * c_ij**2)
    torch.testing.assert_close(method(view1, view2), expected)


def test_vicreg_is_invariance_variance_and_covariance_of_the_projections():
    method = build("vicreg").double()
    view1, view2 = (v.double() for v in fixed_views())
    z1, z2 = method.projector(method.backbone(torch.cat([view1, view2]))).chunk(2)
    n, d = z1.shape
    invariance = (z1 - z2).square().sum() / (n * d)

    def variance(z):
        return sum(F.relu(1 - torch.sqrt(z[:, j].var() + 1e-4)) for j in range(d)) / d

    def covariance(z):
        centred = z - z.mean(0)
        total = sum((centred[:, i] @ centred[:, j] / (n - 1)) ** 2 for i in range(d) for j in range(d) if i != j)
        return total / d

    expected = 25 * invariance + 25 * (variance(z1) + variance(z2)) / 2 + covariance(z1) + covariance(z2)
    torch.testing.assert_close(method(view1, view2), expected)


@pytest.mark.parametrize("name", NAMES)
def test_a_few_steps_on_a_fixed_batch_lower_the_loss_and_train_the_backbone(name):
    method = build(name)
    optimizer = optim.build_optimizer("adamw", optim.parameter_groups(method, 0.0, False), lr=3e-3)
    views, history = fixed_views(), []
    for step in range(6):
        loss = method(*views)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        method.after_optimizer_step(step, 6)
        history.append(loss.item())
    assert all(torch.isfinite(torch.tensor(history))) and history[-1] < history[0], history
    trained = set(optim.parameter_groups(method, 0.0, False)[0]["names"])
    assert {f"backbone.{n}" for n, _ in method.backbone.named_parameters()} <= trained


# --------------------------------------------------------------------------- multi-crop's local views


def local_views(n: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Two smaller "views" of the same n digits: 4x4 crops of the top and bottom halves, with a little noise."""
    pixels, _ = load_digits(return_X_y=True)
    images = torch.tensor(pixels[:n], dtype=torch.float32).view(n, 1, 8, 8) / 16
    noise = torch.Generator().manual_seed(2)
    return tuple(images[:, :, top : top + 4, 2:6] + 0.05 * torch.randn(n, 1, 4, 4, generator=noise) for top in (0, 4))


def by_hand(name: str, method, view1, view2, *local):
    """The loss each method trains, from its modules called one by one: the global views through the backbone in
    one batch, the local views in a second, the targets of the global views only; the two-view loss without
    local views, as the methods computed it before they took local views."""
    features = method.backbone(torch.cat([view1, view2]))
    if local:
        features = torch.cat([features, method.backbone(torch.cat(local))])
    if name in ("barlow_twins", "vicreg"):
        z = method.projector(features).chunk(2 + len(local))
        return method.loss.multi_view(*z) if local else method.loss(*z)
    if name == "simsiam":
        projections = method.projector(features)
        predictions, targets = method.predictor(projections), projections[: 2 * len(view1)]
        return method.loss.multi_view(predictions, targets) if local else method.loss(predictions, projections)
    queries = method.predictor(method.projector(features))
    with torch.no_grad():
        targets = method.momentum_projector(method.momentum_backbone(torch.cat([view1, view2])))
    return method.loss.multi_view(queries, targets) if local else method.loss(queries, targets)


@pytest.mark.parametrize("name", NAMES)
def test_without_local_views_the_forward_is_the_two_view_loss_exactly(name):
    method = build(name)
    views = fixed_views()
    assert torch.equal(method(*views), by_hand(name, method, *views))


@pytest.mark.parametrize("name", NAMES)
def test_local_views_are_predicted_against_the_global_views_targets(name):
    """Value and gradient of every parameter, in float64, with two local views of 4x4 next to the 8x8 globals."""
    method = build(name).double()
    views = [view.double() for view in (*fixed_views(), *local_views())]
    loss = method(*views)
    loss.backward()
    by_method = grads(method)
    method.zero_grad()
    expected = by_hand(name, method, *views)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-12)
    assert by_method.keys() == grads(method).keys()
    for key, grad in grads(method).items():
        torch.testing.assert_close(by_method[key], grad, rtol=1e-10, atol=1e-12, msg=key)
    # and the local views count: the loss is not the two-view loss of the global views
    assert not torch.allclose(loss, by_hand(name, method, *views[:2]))


# --------------------------------------------------------------------------- recipe mistakes


@pytest.mark.parametrize(
    "name, wrong, words",
    [
        ("byol", "ntxent", "trains with loss.name byol, got 'ntxent'"),
        ("simsiam", "byol", "loss.name 'byol' trains with method.name=byol"),
        ("barlow_twins", "vicreg", "loss.name 'vicreg' trains with method.name=vicreg"),
        ("vicreg", "supcon", "trains with loss.name vicreg, got 'supcon'"),
        ("mocov3", "simsiam", "loss.name 'simsiam' trains with method.name=simsiam"),
    ],
)
def test_a_loss_of_another_form_is_one_line(name, wrong, words):
    with pytest.raises(UserError) as caught:
        config_from_dict({"method": {"name": name}, "loss": {"name": wrong}})
    assert words in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


@pytest.mark.parametrize("name, words", [("barlow_twins", "standardises each feature"), ("vicreg", "variance")])
def test_a_batch_too_small_for_the_statistics_is_one_line_before_anything_is_written(tmp_path, name, words):
    with pytest.raises(UserError) as caught:
        train(load_config(f"quickstart_{name}", [f"run.output_dir={tmp_path}", "train.batch_size=1"]))
    message = str(caught.value)
    assert words in message and "train.batch_size >= 2" in message and "\n" not in message, message
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "options, words",
    [
        ({"momentum": 0.999, "momentum_final": 0.99}, "0 <= momentum <= momentum_final <= 1"),
        ({"predictor_hidden": 0}, "method.predictor_hidden must be >= 1"),
    ],
)
def test_byol_and_simsiam_options_are_checked_in_one_line(options, words):
    for name in ["byol", "simsiam"] if "predictor_hidden" in options else ["byol"]:
        with pytest.raises(UserError, match=words):
            config_from_dict({"method": {"name": name, **options}, "loss": {"name": name}})


def test_each_method_takes_its_own_defaults_for_a_shared_option():
    """momentum and predictor_hidden are read by several methods, each with the default of its paper."""
    recipes = {name: {"method": {"name": name}, "loss": {"name": name}} for name in NAMES}
    options = {name: config_from_dict(recipe).method.options for name, recipe in recipes.items()}
    assert (options["byol"]["momentum"], options["byol"]["predictor_hidden"]) == (0.996, 4096)
    assert options["simsiam"]["predictor_hidden"] == 512
    mocov3 = config_from_dict({"method": {"name": "mocov3"}}).method.options
    assert (mocov3["momentum"], mocov3["predictor_hidden"]) == (0.99, 4096)


# --------------------------------------------------------------------------- a run, resumed, exported

TINY = ["train.batch_size=32", "train.threads=1", "eval.linear_epochs=0", "eval.compare_random_init=false"]
TINY += ["eval.compare_raw_pixels=false", "model.width=4", "model.projector_hidden=32", "train.log_every_steps=1"]
TINY += ["train.max_steps=4", "train.checkpoint_every_steps=2", "train.keep_checkpoints=3"]


def test_byol_trains_resumes_exactly_and_exports_the_online_backbone(tmp_path):
    def run(name: str, *overrides: str) -> None:
        cfg = load_config("quickstart_byol", [f"run.output_dir={tmp_path}", f"run.name={name}", *TINY, *overrides])
        train(cfg)

    def losses(name: str) -> list[float]:
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if "loss" in r]

    run("straight", "method.predictor_hidden=16")
    # stopped after its step-2 checkpoint, then resumed
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step-00000004")
    for name in ("backbone.safetensors", "results.json"):
        (tmp_path / "resumed" / name).unlink()
    run("resumed", "method.predictor_hidden=16", "run.resume=auto")
    assert losses("resumed") == losses("straight")
    straight, resumed = (load_file(tmp_path / name / "backbone.safetensors") for name in ("straight", "resumed"))
    assert straight.keys() == resumed.keys() and all(torch.equal(straight[key], resumed[key]) for key in straight)
    # the online backbone is what is saved, evaluated and exported, never the target network
    state = load_file(tmp_path / "straight" / "checkpoints" / "step-00000004" / "model.safetensors")
    online = {key.removeprefix("backbone."): value for key, value in state.items() if key.startswith("backbone.")}
    assert online.keys() == straight.keys() and all(torch.equal(online[key], straight[key]) for key in online)
    assert not all(torch.equal(state[f"momentum_backbone.{key}"], online[key]) for key in online)
    assert "knn_top1" in json.loads((tmp_path / "straight" / "results.json").read_text())["results"]["trained"]
    path, difference = export(tmp_path / "straight", "safetensors")
    exported = load_file(path)
    assert exported.keys() == straight.keys() and all(torch.equal(exported[key], straight[key]) for key in straight)
