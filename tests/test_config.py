"""Recipes load strictly: every user mistake is one UserError naming the key, the file and the choices."""

import dataclasses
import textwrap
from pathlib import Path

import pytest

from sslkit.config import (
    BUNDLED_RECIPES,
    bundled_recipes,
    config_from_dict,
    find_recipe,
    load_config,
    save_config,
    to_dict,
)
from sslkit.errors import UserError


def write(tmp_path, text):
    path = tmp_path / "recipe.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_every_recipe_loads():
    recipes = sorted(Path(__file__).parents[1].joinpath("recipes").glob("*.yaml"))
    assert recipes, "no recipes found"
    for recipe in recipes:
        load_config(recipe)


def test_overrides_are_typed_and_dotted(tmp_path):
    path = write(tmp_path, "train: {epochs: 3}\nloss: {name: ntxent, temperature: 0.5}\n")
    cfg = load_config(
        path, ["train.epochs=5", "loss.temperature=0.2", "augment.crop_scale=[0.2, 1.0]", "run.resume=auto"]
    )
    assert cfg.train.epochs == 5
    assert cfg.loss.kwargs == {"temperature": 0.2}
    assert cfg.augment.crop_scale == (0.2, 1.0)
    assert cfg.run.resume == "auto"


def test_int_is_accepted_for_float(tmp_path):
    cfg = load_config(write(tmp_path, "optim: {lr: 1}\n"))
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)


def test_exponent_without_dot_is_a_float(tmp_path):
    """YAML 1.1 reads 1e-3 as a string; a float field takes it as the number the user meant."""
    cfg = load_config(write(tmp_path, "optim: {lr: 1e-3}\n"), ["optim.weight_decay=5e-4"])
    assert cfg.optim.lr == 1e-3 and cfg.optim.weight_decay == 5e-4
    cfg = load_config(write(tmp_path, "loss: {name: ntxent, temperature: 5e-2}\n"))
    assert cfg.loss.kwargs["temperature"] == 0.05


VIT_LOCAL = "model: {backbone: vit_tiny_patch16_224, kwargs: {img_size: 16, patch_size: 4, dynamic_img_size: true}}\n"
VIT_FIXED = VIT_LOCAL.replace(", dynamic_img_size: true", "")


@pytest.mark.parametrize(
    "text, words",
    [
        ("train: {epoch: 3}\n", ["unknown key 'train.epoch'", "epochs", "recipe.yaml"]),
        ("trian: {epochs: 3}\n", ["unknown key 'trian'", "train"]),
        ("train: {epochs: three}\n", ["'train.epochs' must be int", "three"]),
        ("train: {epochs: 2.5}\n", ["'train.epochs' must be int"]),
        ("data: {name: mnist}\n", ["unknown data.name 'mnist'", "digits", "fashion_mnist"]),
        ("model: {backbone: vgg}\n", ["unknown model.backbone 'vgg'", "resnet18"]),
        ("loss: {name: ntx}\n", ["unknown loss.name 'ntx'", "ntxent"]),
        ("optim: {name: adam}\n", ["unknown optim.name 'adam'", "adamw", "lars"]),
        ("loss: {name: ntxent, temprature: 0.1}\n", ["unknown key 'loss.temprature'", "temperature"]),
        ("loss: {name: ntxent, temperature: 0}\n", ["temperature", "> 0"]),
        ("loss: {name: ntxent, temperature: hot}\n", ["'loss.temperature' must be float"]),
        ("augment: {crop_scale: [0.5]}\n", ["'augment.crop_scale' must be a list of 2"]),
        ("augment: {hflip_p: 1.5}\n", ["'augment.hflip_p' must be in [0.0, 1.0]"]),
        ("train: 3\n", ["'train' must be a section"]),
        ("augment: {blur_kernel: 4}\n", ["'augment.blur_kernel' must be an odd size"]),
        ("augment: {solarize_p_view2: 2}\n", ["'augment.solarize_p_view2' must be in [0.0, 1.0]"]),
        ("augment: {crop_ratio: [2, 1]}\n", ["'augment.crop_ratio'"]),
        ("augment: {crop_scale_view2: [0.5, 1.2]}\n", ["'augment.crop_scale_view2' must be [low, high]", "<= 1"]),
        ("augment: {jitter_p_view2: -0.1}\n", ["'augment.jitter_p_view2' must be in [0.0, 1.0]"]),
        ("eval: {linear_epochs: -1}\n", ["'eval.linear_epochs' must be >= 0"]),
        ("train: {mixed_precision: fp8}\n", ["train.mixed_precision", "bf16"]),
        ("train: {epochs: [1\n", ["not valid YAML"]),
        ("run: {name: ../../escape}\n", ["'run.name' must be a plain folder name", "run.output_dir"]),
        ("run: {name: a/b}\n", ["'run.name' must be a plain folder name"]),
        ("method: {name: sim}\n", ["unknown method.name 'sim'", "simclr", "moco"]),
        ("method: {name: moco, queue_sise: 8}\n", ["unknown key 'method.queue_sise'", "queue_size", "recipe.yaml"]),
        ("method: {name: moco, queue_size: many}\n", ["'method.queue_size' must be int", "many"]),
        ("method: {name: moco, queue_size: 0}\n", ["method.queue_size must be >= 1", "recipe.yaml"]),
        ("method: {name: nce}\nloss: {name: nce, bank_size: 9}\n", ["loss.bank_size is set by method 'nce'"]),
        ("method: {name: distill, distill_temperature: 0}\nloss: {name: softmax}\n", ["must be > 0"]),
        ("method: {name: simclr}\nloss: {name: arcface}\n", ["method 'simclr' needs a two-view loss", "supervised"]),
        # multi-crop
        ("augment: {local_views: -1}\n", ["'augment.local_views' must be >= 0"]),
        ("augment: {local_views: 4}\n", ["'augment.local_size' must be set with augment.local_views=4"]),
        ("augment: {local_views: 4, local_size: 40}\n", ["must not be larger than the global views", "got 40"]),
        ("augment: {local_crop_scale: [0, 0.4]}\n", ["'augment.local_crop_scale' must be [low, high]"]),
        (
            "augment: {local_views: 2, local_size: 16}\nmethod: {name: nce}\nloss: {name: nce}\n",
            ["method 'nce' trains on its global views only", "simclr, supcon, moco, mocov3, byol, simsiam, barlow"],
        ),
        ("augment: {local_views: 2, local_size: 16}\nloss: {name: dcl}\n", ["set loss.name=ntxent, got 'dcl'"]),
        ("method: {name: dino}\nloss: {name: dino, num_global_views: 1}\n", ["loss.num_global_views must be 2"]),
        (
            VIT_LOCAL + "augment: {image_size: 16, local_views: 2, local_size: 6}\n",
            ["patch size 4", "does not divide augment.local_size=6"],
        ),
        (
            VIT_FIXED + "augment: {image_size: 16, local_views: 1, local_size: 8}\n",
            ["built for 16x16 images", "set model.kwargs.dynamic_img_size=true"],
        ),
        ("eval: {recall_ks: [1, 0]}\n", ["'eval.recall_ks' must be a non-empty list of integers >= 1", "[1, 0]"]),
        ("loss: {name: ntxent, miner: batch_hard}\n", ["loss 'ntxent' takes no miner", "multi_similarity"]),
        ("method: {name: supervised}\nloss: {name: arcface, memory_size: 8}\n", ["takes no cross-batch memory"]),
        ("method: {name: supervised}\nloss: {name: sphereface, partial_fc: true}\n", ["has no Partial FC", "cosface"]),
        ("data: {sampler: m_per_class, m_per_class: 1}\n", ["data.m_per_class=1 puts one image", "2 or more"]),
    ],
)
def test_mistakes_name_the_key_and_the_choices(tmp_path, text, words):
    with pytest.raises(UserError) as info:
        load_config(write(tmp_path, text))
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_mixed_precision_no_unquoted_is_the_choice_no(tmp_path):
    """YAML 1.1 reads `no` as false; for train.mixed_precision it can only mean the choice "no"."""
    assert load_config(write(tmp_path, "train: {mixed_precision: no}\n")).train.mixed_precision == "no"
    assert load_config(write(tmp_path, "train: {}\n"), ["train.mixed_precision=no"]).train.mixed_precision == "no"


@pytest.mark.parametrize(
    "method, loss",
    [("simclr", "ntxent"), ("mocov3", "ntxent"), ("supcon", "supcon"), ("byol", "byol"), ("simsiam", "simsiam")]
    + [("barlow_twins", "barlow_twins"), ("vicreg", "vicreg")],
)
def test_a_batch_of_one_is_refused_where_the_batch_holds_the_negatives_or_the_statistics(tmp_path, method, loss):
    """One image contrasted with nothing gives a loss of exactly 0, and has no per-feature statistics (the
    losses' of Barlow Twins and VICReg, the predictor's BatchNorm): refused before any data is read."""
    with pytest.raises(UserError) as info:
        load_config(write(tmp_path, f"method: {{name: {method}}}\nloss: {{name: {loss}}}\ntrain: {{batch_size: 1}}\n"))
    message = str(info.value)
    assert "\n" not in message and f"method '{method}'" in message and "train.batch_size >= 2" in message
    load_config(write(tmp_path, f"method: {{name: {method}}}\nloss: {{name: {loss}}}\ntrain: {{batch_size: 2}}\n"))


@pytest.mark.parametrize("method, loss", [("moco", "ntxent"), ("nce", "nce"), ("supervised", "arcface")])
def test_a_batch_of_one_is_fine_where_the_negatives_come_from_elsewhere(tmp_path, method, loss):
    """MoCo's queue, NCE's memory bank and a head's class weights need no other image in the batch."""
    cfg = load_config(
        write(tmp_path, f"method: {{name: {method}}}\nloss: {{name: {loss}}}\ntrain: {{batch_size: 1}}\n")
    )
    assert cfg.train.batch_size == 1


def test_a_method_key_the_method_does_not_read_is_noted(tmp_path, capsys):
    """The method section may hold every method's options: one set for another method would do nothing, silently.
    A saved config.yaml lists every key at its default: those are no note (evaluate once printed one)."""
    from sslkit.methods import option_fields, unused_options

    cfg = load_config(write(tmp_path, "method: {name: simclr, queue_size: 1024}\n"), ["method.num_negatives=64"])
    assert unused_options(cfg) == (
        "method 'simclr' does not read method.queue_size=1024 (read by moco), "
        "method.num_negatives=64 (read by nce); they have no effect on this run"
    )
    assert unused_options(load_config(write(tmp_path, "method: {name: moco, queue_size: 1024, bn_splits: 4}\n"))) == ""
    saved = tmp_path / "config.yaml"
    save_config(load_config(write(tmp_path, "method: {name: simclr}\n")), saved)
    assert "queue_size" in saved.read_text() and unused_options(load_config(saved)) == ""
    assert set(load_config(saved).method.options) == set(option_fields())
    assert capsys.readouterr().err == ""  # loading a recipe prints nothing: the trainer prints the note


def test_missing_recipe_lists_the_bundled_ones(tmp_path):
    for missing in (tmp_path / "nope.yaml", "nope", "recipes/nope.yaml", "elsewhere/quickstart.yaml"):
        with pytest.raises(
            UserError, match=r"not found: give a YAML file's path or a bundled recipe's name \(.*quickstart, .*simclr"
        ):
            load_config(missing)


def test_a_folder_given_as_the_recipe_names_a_file_in_it(tmp_path):
    with pytest.raises(UserError, match=r"is a folder; give a YAML file in it, e.g. .*quickstart.yaml, or a bundled"):
        load_config(Path(__file__).parents[1] / "recipes")


@pytest.mark.parametrize("name", ["quickstart", "quickstart.yaml", "recipes/quickstart.yaml"])
def test_a_bundled_recipe_loads_by_name_from_any_directory(tmp_path, monkeypatch, name):
    """Installed without the repository, the README's commands still find the recipes shipped in the package."""
    monkeypatch.chdir(tmp_path)
    assert find_recipe(name) == BUNDLED_RECIPES / "quickstart.yaml"
    assert load_config(name).run.name == "quickstart"


def test_a_users_own_recipe_file_wins_over_the_bundled_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "quickstart.yaml").write_text("run: {name: mine}\n")
    assert load_config("recipes/quickstart.yaml").run.name == "mine"
    assert load_config("quickstart").run.name == "quickstart"  # a bare name is the bundled recipe


def test_the_bundled_recipes_are_the_repositorys(tmp_path):
    """recipes/ at the repository root is the package's sslkit/recipes, so the two cannot drift apart."""
    root = Path(__file__).parents[1]
    assert (root / "recipes").resolve() == BUNDLED_RECIPES
    assert set(bundled_recipes()) >= {"quickstart", "simclr", "moco", "supcon", "arcface"}


def test_bad_override_syntax(tmp_path):
    with pytest.raises(UserError, match="key.sub=value"):
        load_config(write(tmp_path, ""), ["train.epochs"])


def test_round_trip_through_saved_config(tmp_path):
    cfg = load_config(write(tmp_path, "loss: {name: ntxent, temperature: 0.3}\ntrain: {epochs: 7}\n"))
    save_config(cfg, tmp_path / "saved.yaml")
    again = load_config(tmp_path / "saved.yaml")
    assert to_dict(again) == to_dict(cfg)


def test_empty_dict_gives_defaults():
    cfg = config_from_dict({})
    assert cfg.data.name == "digits" and cfg.loss.name == "ntxent"


def test_another_loss_on_the_command_line_drops_the_recipe_keys_it_does_not_take(tmp_path, capsys):
    path = write(tmp_path, "method: {name: supervised}\nloss: {name: arcface, scale: 16.0, margin: 0.3}\n")
    cfg = load_config(path, ["loss.name=proxy_anchor"])
    assert cfg.loss.name == "proxy_anchor" and cfg.loss.kwargs == {}
    note = capsys.readouterr().err
    assert "dropped loss.scale=16.0, loss.margin=0.3 (proxy_anchor does not take them)" in note
    assert "\n" not in note.strip()  # one line
    load_config(path, ["loss.name=proxy_anchor", "train.epochs=3"])  # a sweep's next point: said once is enough
    assert capsys.readouterr().err == ""


def test_another_loss_keeps_the_keys_it_takes_and_says_so(tmp_path, capsys):
    path = write(tmp_path, "loss: {name: ntxent, temperature: 0.05}\n")
    assert load_config(path, ["loss.name=dcl"]).loss.kwargs == {"temperature": 0.05}
    assert "kept loss.temperature=0.05" in capsys.readouterr().err
    load_config(path, ["loss.temperature=0.2"])  # the same loss: nothing to say
    assert capsys.readouterr().err == ""


def test_loss_keys_given_on_the_command_line_are_kept_and_checked(tmp_path):
    path = write(tmp_path, "method: {name: supervised}\nloss: {name: arcface, margin: 0.3}\n")
    cfg = load_config(path, ["loss.name=cosface", "loss.margin=0.35"])
    assert cfg.loss.kwargs == {"margin": 0.35}
    with pytest.raises(UserError, match="unknown key 'loss.margin' for loss 'proxy_nca'"):
        load_config(path, ["loss.name=proxy_nca", "loss.margin=0.1"])


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb"])
def test_a_tracker_without_its_package_is_one_line(monkeypatch, tracker):
    """A tracker whose package is missing: Accelerate would only warn and log nothing."""
    import importlib.util

    from sslkit.config import config_from_dict
    from sslkit.errors import UserError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == tracker else real(name, *a))
    with pytest.raises(UserError, match=f"pip install {tracker}"):
        config_from_dict({"train": {"trackers": [tracker]}})
    config_from_dict({"train": {"trackers": []}})


def test_a_saved_config_with_the_old_tensorboard_key_still_loads():
    """Run directories written before train.trackers replaced train.tensorboard still evaluate and resume."""
    from sslkit.config import config_from_dict

    assert config_from_dict({"train": {"tensorboard": False}}).train.trackers == []
    assert config_from_dict({"train": {"tensorboard": True}}).train.trackers == ["tensorboard"]
    both = {"train": {"tensorboard": True, "trackers": ["wandb", "tensorboard"]}}
    assert config_from_dict(both).train.trackers == ["wandb", "tensorboard"]


@pytest.mark.parametrize(
    "train, words",
    [
        ({"trackers": ["tensorbord"]}, ["train.trackers", "tensorbord", "tensorboard"]),
        ({"compile_mode": "fast"}, ["train.compile_mode", "reduce-overhead"]),
    ],
)
def test_tracker_and_compile_mistakes_are_one_line(train, words):
    from sslkit.config import config_from_dict
    from sslkit.errors import UserError

    with pytest.raises(UserError) as info:
        config_from_dict({"train": train})
    assert all(word in str(info.value) for word in words), str(info.value)


@pytest.mark.parametrize("module, positional", [("sslkit.cli.pretrain", "recipe"), ("sslkit.cli.evaluate", "target")])
def test_a_command_without_arguments_names_only_the_one_it_needs(module, positional, capsys):
    """The overrides are optional: argparse listed them as required too (nargs='*' without a default)."""
    import importlib

    with pytest.raises(SystemExit) as info:
        importlib.import_module(module).parse_args([])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"the following arguments are required: {positional}")


def test_field_docs_reads_a_google_style_attributes_section():
    """The parser behind docs/config.md: one entry per field, continuation lines joined, ``name (type):`` allowed."""
    from sslkit.config import field_docs

    @dataclasses.dataclass
    class Section:
        """What the section is.

        Attributes:
            plain: One line.
            wrapped: A first line
                and its continuation: with a colon.
            typed (int | None): The type in brackets is dropped.

        Note:
            Not an attribute.
        """

        plain: int = 0
        wrapped: str = ""
        typed: int | None = None

    assert field_docs(Section) == {
        "plain": "One line.",
        "wrapped": "A first line and its continuation: with a colon.",
        "typed": "The type in brackets is dropped.",
    }

    @dataclasses.dataclass
    class Undocumented:
        value: int = 0

    assert field_docs(Undocumented) == {}


@pytest.mark.parametrize(
    "name",
    [
        "fashion_mnist_metric_losses",
        "fashion_mnist_metric_losses.yaml",
        "recipes/variants/fashion_mnist_metric_losses.yaml",  # the README's spelling, from any directory
        "variants/fashion_mnist_metric_losses.yaml",
    ],
)
def test_a_bundled_variants_file_is_found_by_name_from_any_directory(tmp_path, monkeypatch, name):
    from sslkit.schema.reading import find_variants

    monkeypatch.chdir(tmp_path)
    assert find_variants(name) == BUNDLED_RECIPES / "variants" / "fashion_mnist_metric_losses.yaml"
    with pytest.raises(UserError, match="bundled variants file's name \\(fashion_mnist_metric_losses"):
        find_variants("nope.yaml")


def test_the_command_lines_choice_of_labelled_images_replaces_the_recipes(tmp_path, capsys):
    cfg = load_config("quickstart_finetune", ["data.label_subset=chosen.json"])  # the recipe keeps 5% of the labels
    assert cfg.data.label_subset == "chosen.json" and cfg.data.label_fraction is None
    assert "data.label_subset=chosen.json from the command line replaces the recipe's data.label_fraction=0.05" in (
        capsys.readouterr().err
    )
    recipe = tmp_path / "chosen.yaml"
    recipe.write_text(
        (BUNDLED_RECIPES / "quickstart_finetune.yaml")
        .read_text()
        .replace("label_fraction: 0.05", "label_subset: a.json")
    )
    cfg = load_config(recipe, ["data.labels_per_class=3"])
    assert cfg.data.labels_per_class == 3 and cfg.data.label_subset is None
    assert "replaces the recipe's data.label_subset=a.json" in capsys.readouterr().err


def test_two_choices_of_labelled_images_are_refused_wherever_they_are_given(tmp_path):
    with pytest.raises(UserError, match="names the labelled images itself"):
        load_config("quickstart_finetune", ["data.label_subset=chosen.json", "data.label_fraction=0.1"])
    recipe = tmp_path / "both.yaml"
    text = (BUNDLED_RECIPES / "quickstart_finetune.yaml").read_text()
    recipe.write_text(text.replace("label_fraction: 0.05", "label_fraction: 0.05\n  label_subset: a.json"))
    with pytest.raises(UserError, match="names the labelled images itself"):
        load_config(recipe)
