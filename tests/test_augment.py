"""Two-view augmentation: shapes and channels, per-sample randomness, the identity when every
probability is 0, the hand-written pieces (crop, colour jitter) against torchvision, asymmetric
views, devices, and the show_augmentations tool on a real recipe."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision.transforms.v2 import functional as TF

from sslkit.augment import (
    ColorJitter,
    EvalTransform,
    TwoViewAugment,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    kernel_size_for,
    resized_crop,
)
from sslkit.cli import show_augmentations
from sslkit.config import AugmentConfig
from sslkit.datasets.batches import ImageBatch

ROOT = Path(__file__).resolve().parents[1]

RGB_STATS = ((0.4, 0.5, 0.6), (0.2, 0.25, 0.3))
GREY_STATS = ((0.3,), (0.35,))

# Every random op off and the crop the whole image: what is left is resize and normalise.
NOTHING_RANDOM = dict(
    crop_scale=(1.0, 1.0),
    crop_ratio=(1.0, 1.0),
    hflip_p=0.0,
    jitter_p=0.0,
    grayscale_p=0.0,
    blur_p=0.0,
    solarize_p=0.0,
)


def random_images(batch, channels, size, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, channels, size, size), generator=g, dtype=torch.uint8)


def stats(channels):
    return RGB_STATS if channels == 3 else GREY_STATS


# --------------------------------------------------------------------------- shapes and channels


@pytest.mark.parametrize("channels,size,out_size", [(3, 32, 32), (1, 28, 32), (1, 8, 16), (3, 96, 64)])
def test_views_have_the_crop_size_dtype_and_channels(channels, size, out_size):
    cfg = AugmentConfig(image_size=out_size, solarize_p=0.2, blur_p_view2=0.1)
    augment = TwoViewAugment(cfg, channels, *stats(channels))
    view1, view2 = augment(random_images(5, channels, size))
    assert augment.out_channels == channels
    for view in (view1, view2):
        assert view.shape == (5, channels, out_size, out_size)
        assert view.dtype == torch.float32
        assert torch.isfinite(view).all()


def test_eval_transform_shape_and_channels():
    preprocess = EvalTransform(16, 1, *GREY_STATS)
    assert preprocess(random_images(3, 1, 8)).shape == (3, 1, 16, 16)
    assert preprocess.out_channels == 1
    assert EvalTransform(32, 3, *RGB_STATS)(random_images(2, 3, 96)).shape == (2, 3, 32, 32)


def test_rejects_wrong_inputs():
    with pytest.raises(ValueError, match="channels"):
        TwoViewAugment(AugmentConfig(), 4, (0.5,) * 4, (0.2,) * 4)
    with pytest.raises(ValueError, match="one value per channel"):
        TwoViewAugment(AugmentConfig(), 3, (0.5,), (0.2,))
    with pytest.raises(ValueError, match="blur_kernel"):
        TwoViewAugment(AugmentConfig(blur_kernel=4), 3, *RGB_STATS)
    augment = TwoViewAugment(AugmentConfig(), 3, *RGB_STATS)
    with pytest.raises(ValueError, match="uint8"):
        augment(torch.rand(2, 3, 32, 32))
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        augment(random_images(2, 1, 32))


@pytest.mark.parametrize("size,kernel", [(8, 3), (16, 3), (32, 3), (64, 7), (96, 9), (224, 23)])
def test_kernel_size_is_the_odd_integer_nearest_a_tenth(size, kernel):
    assert kernel_size_for(size) == kernel


# --------------------------------------------------------------------------- randomness


def test_views_differ_from_each_other_and_between_identical_images():
    augment = TwoViewAugment(AugmentConfig(), 3, *RGB_STATS)
    images = random_images(1, 3, 32).repeat(8, 1, 1, 1)  # eight copies of one image
    torch.manual_seed(0)
    view1, view2 = augment(images)
    assert not torch.allclose(view1, view2)
    for i in range(1, 8):
        assert not torch.allclose(view1[0], view1[i]), "identical images must get their own random parameters"


def test_crops_are_drawn_per_sample():
    augment = TwoViewAugment(AugmentConfig(**{**NOTHING_RANDOM, "crop_scale": (0.2, 0.6)}), 1, *GREY_STATS)
    images = random_images(1, 1, 32).repeat(6, 1, 1, 1)
    torch.manual_seed(1)
    view1, view2 = augment(images)
    crops = torch.cat([view1, view2])
    distinct = {tuple(c.flatten()[:64].tolist()) for c in crops}
    assert len(distinct) == len(crops)


def test_flip_coin_is_per_sample():
    augment = TwoViewAugment(AugmentConfig(**{**NOTHING_RANDOM, "hflip_p": 0.5}, normalize=False), 1, *GREY_STATS)
    ramp = torch.arange(32, dtype=torch.uint8).mul(8).expand(32, 1, 32, 32).contiguous()  # left dark, right bright
    torch.manual_seed(2)
    view1, view2 = augment(ramp)
    views = torch.cat([view1, view2])
    flipped = views[:, 0, 0, 0] > views[:, 0, 0, -1]
    assert 0 < int(flipped.sum()) < len(views)
    expected = ramp.float() / 255
    for view, is_flipped in zip(views, flipped):
        torch.testing.assert_close(view, expected[0].flip(-1) if is_flipped else expected[0])


def test_flip_folded_into_the_crop_is_the_flipped_crop():
    cfg = AugmentConfig(
        **{**NOTHING_RANDOM, "crop_scale": (0.2, 0.7), "crop_ratio": (0.5, 2.0), "hflip_p": 0.5},
        image_size=16,
        normalize=False,
    )
    augment = TwoViewAugment(cfg, 3, *RGB_STATS)
    images = random_images(6, 3, 24)
    torch.manual_seed(3)
    view1, view2 = augment(images)
    # The same draws in the same order: the crop boxes, then the flip coins.
    torch.manual_seed(3)
    corners = augment.groups[0].crop_boxes[0]((12, 3, 24, 24))["src"]
    flip = torch.rand(12) < 0.5
    crops = resized_crop(
        images.float() / 255, torch.cat([corners[:, 0], corners[:, 2]], dim=1), torch.arange(6).repeat(2), 16
    )
    expected = torch.where(flip[:, None, None, None], crops.flip(-1), crops)
    assert 0 < int(flip.sum()) < 12
    torch.testing.assert_close(torch.cat([view1, view2]), expected, atol=1e-5, rtol=0)


# --------------------------------------------------------------------------- identity and normalisation


@pytest.mark.parametrize("channels,size,out_size", [(3, 32, 32), (1, 8, 16), (3, 12, 32)])
def test_nothing_random_is_the_eval_transform(channels, size, out_size):
    mean, std = stats(channels)
    augment = TwoViewAugment(AugmentConfig(image_size=out_size, **NOTHING_RANDOM), channels, mean, std)
    images = random_images(4, channels, size)
    view1, view2 = augment(images)
    expected = EvalTransform(out_size, channels, mean, std)(images)
    torch.testing.assert_close(view1, expected, rtol=0, atol=2e-5)
    torch.testing.assert_close(view2, expected, rtol=0, atol=2e-5)
    if size == out_size:  # and the eval transform is just (x / 255 - mean) / std
        manual = (images.float() / 255 - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)
        torch.testing.assert_close(expected, manual)


def test_constant_image_normalises_to_its_standard_score():
    # Crop, flip, grayscale and blur keep a constant grey image constant (jitter would not).
    cfg = AugmentConfig(jitter_p=0.0, grayscale_p=0.5, blur_p=1.0)
    mean, std = RGB_STATS
    augment = TwoViewAugment(cfg, 3, mean, std)
    images = torch.full((6, 3, 32, 32), 153, dtype=torch.uint8)  # 0.6
    for view in augment(images):
        for c in range(3):
            channel = view[:, c]
            torch.testing.assert_close(channel.mean(), torch.tensor((0.6 - mean[c]) / std[c]), atol=1e-5, rtol=0)
            assert float(channel.std()) < 1e-5


def test_dataset_statistics_give_zero_mean_unit_std():
    g = torch.Generator().manual_seed(3)
    images = (torch.rand(64, 3, 16, 16, generator=g) * torch.tensor([0.5, 0.8, 1.0]).view(1, 3, 1, 1) * 255).to(
        torch.uint8
    )
    unit = images.float() / 255
    mean = tuple(unit.mean(dim=(0, 2, 3)).tolist())
    std = tuple(unit.std(dim=(0, 2, 3)).tolist())
    out = EvalTransform(16, 3, mean, std)(images)
    torch.testing.assert_close(out.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-4, rtol=0)


# --------------------------------------------------------------------------- single ops and asymmetric views


def test_grayscale_at_p1_gives_equal_channels():
    cfg = AugmentConfig(**{**NOTHING_RANDOM, "grayscale_p": 1.0}, normalize=False)
    for view in TwoViewAugment(cfg, 3, *RGB_STATS)(random_images(4, 3, 32)):
        torch.testing.assert_close(view[:, 0], view[:, 1])
        torch.testing.assert_close(view[:, 1], view[:, 2])


def test_solarize_on_view2_only():
    cfg = AugmentConfig(**{**NOTHING_RANDOM, "solarize_p": 0.0, "solarize_p_view2": 1.0}, normalize=False)
    images = random_images(4, 3, 32)
    view1, view2 = TwoViewAugment(cfg, 3, *RGB_STATS)(images)
    unit = images.float() / 255
    torch.testing.assert_close(view1, unit)
    torch.testing.assert_close(view2, torch.where(unit < 0.5, unit, 1.0 - unit))


def test_blur_probability_per_view():
    cfg = AugmentConfig(**{**NOTHING_RANDOM, "blur_p": 1.0, "blur_p_view2": 0.0}, normalize=False)
    images = random_images(4, 1, 32)
    view1, view2 = TwoViewAugment(cfg, 1, *GREY_STATS)(images)
    unit = images.float() / 255
    torch.testing.assert_close(view2, unit)
    assert (view1 - unit).abs().amax(dim=(1, 2, 3)).min() > 0.01, "every view-1 image is blurred"
    assert view1.var() < unit.var(), "blur smooths"


def test_jitter_on_view2_only():
    cfg = AugmentConfig(**{**NOTHING_RANDOM, "jitter_p_view2": 1.0}, brightness=0.8, contrast=0.8, normalize=False)
    images = random_images(6, 1, 32)
    view1, view2 = TwoViewAugment(cfg, 1, *GREY_STATS)(images)
    torch.testing.assert_close(view1, images.float() / 255)
    assert (view2 - images.float() / 255).abs().amax(dim=(1, 2, 3)).min() > 0.01, "every view-2 image is jittered"


def test_crop_scale_per_view_for_whole_batches_and_images_of_different_sizes():
    """View 1 keeps the whole image (scale 1), view 2 zooms in (scale 0.1-0.2), on both crop paths."""
    cfg = AugmentConfig(**{**NOTHING_RANDOM, "crop_scale_view2": (0.1, 0.2)}, image_size=16, normalize=False)
    augment = TwoViewAugment(cfg, 3, *RGB_STATS)
    images = random_images(5, 3, 16)
    whole = ImageBatch(images, torch.tensor([[16, 16]] * 5))
    for batch in (images, whole):
        view1, view2 = augment(batch)
        torch.testing.assert_close(view1, images.float() / 255)
        # A crop of at most a fifth of the area, upsampled: smoother than the image it came from.
        assert (view2 - images.float() / 255).abs().amax(dim=(1, 2, 3)).min() > 0.05
        assert view2.diff(dim=-1).abs().mean() < 0.6 * (images.float() / 255).diff(dim=-1).abs().mean()
    assert len(TwoViewAugment(cfg, 3, *RGB_STATS, num_views=1).groups[0].crop_boxes) == 1, "one view: one scale"


def test_zero_probability_ops_are_not_built():
    cfg = AugmentConfig(hflip_p=0.0, grayscale_p=0.0, blur_p=0.0, blur_p_view2=0.4, solarize_p=0.0)
    augment = TwoViewAugment(cfg, 1, *GREY_STATS)
    assert augment.groups[0].step_names == ["jitter", "blur"]  # the flip is part of the crop
    assert augment.groups[0].step_probabilities[1] == (0.0, 0.4)


# --------------------------------------------------------------------------- hand-written pieces against torchvision


def _sample_window(image, box, size):
    """Bilinear samples at the pixel centres of a size x size grid laid over the box (F.grid_sample)."""
    x0, y0, x1, y1 = box
    height, width = image.shape[-2:]
    xs = x0 + (torch.arange(size) + 0.5) * (x1 + 1 - x0) / size - 0.5  # pixel coordinates, centres at integers
    ys = y0 + (torch.arange(size) + 0.5) * (y1 + 1 - y0) / size - 0.5
    grid = torch.stack(torch.meshgrid((2 * xs + 1) / width - 1, (2 * ys + 1) / height - 1, indexing="xy"), dim=-1)
    return F.grid_sample(image[None], grid[None], mode="bilinear", padding_mode="border", align_corners=False)[0]


def test_resized_crop_samples_the_box_and_resizes_its_inside_like_torchvision():
    g = torch.Generator().manual_seed(4)
    images = torch.rand(3, 2, 20, 24, generator=g)
    boxes = torch.tensor([[0, 0, 23, 19], [3, 5, 12, 9], [10, 2, 10, 15], [7, 7, 16, 16]], dtype=torch.float32)
    index = torch.tensor([0, 1, 2, 0])
    out = resized_crop(images, boxes, index, 24)  # every crop is at most 24 wide: upsampling only
    for crop, box, i in zip(out, boxes.long().tolist(), index.tolist()):
        torch.testing.assert_close(crop, _sample_window(images[i], box, 24), atol=1e-5, rtol=0)
    # Away from the box's edge this is torchvision's crop-then-resize; within half a source
    # pixel of the edge the samples blend with the pixels just outside the box.
    x0, y0, x1, y1 = boxes[3].long().tolist()
    piece = images[0:1, :, y0 : y1 + 1, x0 : x1 + 1]
    expected = F.interpolate(piece, size=(24, 24), mode="bilinear", align_corners=False)[0]
    torch.testing.assert_close(out[3, :, 2:-2, 2:-2], expected[:, 2:-2, 2:-2], atol=1e-5, rtol=0)
    torch.testing.assert_close(
        out[0], F.interpolate(images[0:1], size=(24, 24), mode="bilinear", align_corners=False)[0], atol=1e-5, rtol=0
    )


def test_resized_crop_paths_agree_where_both_apply():
    """Crops no larger than the output take F.grid_sample; a batch with one larger crop takes
    roi_align for all. On the crops both can do, they give the same pixels."""
    g = torch.Generator().manual_seed(7)
    images = torch.rand(4, 3, 32, 32, generator=g)
    side = torch.randint(4, 33, (12, 2), generator=g)
    corner = (torch.rand(12, 2, generator=g) * (33 - side)).floor()
    small = torch.cat([corner, corner + side - 1], dim=1).float()  # every crop <= 32: the grid path
    index = torch.arange(12) % 4
    large = torch.tensor([[0.0, 0.0, 63.0, 63.0]])  # 64 > 32: forces roi_align for the whole call
    grid_path = resized_crop(images, small, index, 32)
    big_image = F.pad(images, (0, 32, 0, 32), mode="replicate")  # replicate: the edge clamps as before
    roi_path = resized_crop(big_image, torch.cat([small, large]), torch.cat([index, torch.tensor([0])]), 32)[:12]
    torch.testing.assert_close(grid_path, roi_path, atol=1e-5, rtol=0)


def test_resized_crop_does_not_alias_when_shrinking():
    checkerboard = ((torch.arange(64)[:, None] + torch.arange(64)[None, :]) % 2).float().expand(1, 1, 64, 64)
    out = resized_crop(checkerboard, torch.tensor([[0.0, 0.0, 63.0, 63.0]]), torch.tensor([0]), 16)
    torch.testing.assert_close(out, torch.full_like(out, 0.5), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "ours,theirs,channels",
    [
        (adjust_brightness, TF.adjust_brightness, 3),
        (adjust_contrast, TF.adjust_contrast, 3),
        (adjust_contrast, TF.adjust_contrast, 1),
        (adjust_saturation, TF.adjust_saturation, 3),
    ],
)
def test_colour_steps_match_torchvision(ours, theirs, channels):
    g = torch.Generator().manual_seed(5)
    images = torch.rand(6, channels, 9, 11, generator=g)
    factor = torch.rand(6, generator=g) * 1.6  # 0 .. 1.6, both sides of 1
    expected = torch.stack([theirs(image, float(f)) for image, f in zip(images, factor)])
    torch.testing.assert_close(ours(images, factor), expected, atol=1e-6, rtol=0)


def test_hue_matches_torchvision_including_grey_and_tied_pixels():
    g = torch.Generator().manual_seed(6)
    images = torch.rand(8, 3, 10, 10, generator=g)
    images[0] = images[0, :1]  # grey: chroma 0
    images[1, 1] = images[1, 0]  # red and green tie
    images[2, 2] = images[2, 1]  # green and blue tie
    images[3] = images[3].round()  # saturated corners of the colour cube
    factor = torch.tensor([0.3, -0.5, 0.5, 0.25, -0.1, 0.0, 0.45, -0.33])
    expected = torch.stack([TF.adjust_hue(image, float(f)) for image, f in zip(images, factor)])
    torch.testing.assert_close(adjust_hue(images, factor), expected, atol=5e-6, rtol=0)


def test_color_jitter_is_torchvision_in_the_drawn_order():
    jitter = ColorJitter(0.4, 0.4, 0.4, 0.1)
    images = torch.rand(5, 3, 8, 8, generator=torch.Generator().manual_seed(7))
    torch.manual_seed(8)
    out = jitter(images)
    torch.manual_seed(8)
    params = jitter.draw(images.shape)  # the same draw again
    steps = [
        ("brightness_factor", TF.adjust_brightness),
        ("contrast_factor", TF.adjust_contrast),
        ("saturation_factor", TF.adjust_saturation),
        ("hue_factor", TF.adjust_hue),
    ]
    for i, image in enumerate(images):
        for step in params["order"].tolist():
            key, adjust = steps[step]
            image = adjust(image, float(params[key][i]))
        torch.testing.assert_close(out[i], image, atol=1e-5, rtol=0)
    assert 0.6 <= float(params["brightness_factor"].min()) and float(params["brightness_factor"].max()) <= 1.4
    assert float(params["hue_factor"].abs().max()) <= 0.1


# --------------------------------------------------------------------------- devices


def _devices():
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices.append("cuda")
    if torch.backends.mps.is_available():
        devices.append("mps")
    return devices


@pytest.mark.parametrize("device", _devices())
def test_device_follows_the_input(device):
    cfg = AugmentConfig(solarize_p=0.3)
    augment = TwoViewAugment(cfg, 3, *RGB_STATS).to(device)
    images = random_images(4, 3, 32).to(device)
    for view in augment(images):
        assert view.device == images.device
    assert EvalTransform(32, 3, *RGB_STATS).to(device)(images).device == images.device
    # Random draws stay on the CPU whatever the module's device (see TwoViewAugment._apply).
    assert all(m.device == torch.device("cpu") for m in augment.modules() if hasattr(m, "set_rng_device_and_dtype"))


def test_no_gradient_is_recorded():
    view1, _ = TwoViewAugment(AugmentConfig(), 3, *RGB_STATS)(random_images(2, 3, 32))
    assert not view1.requires_grad
    weight = torch.randn(4, 3, 3, 3, requires_grad=True)
    F.conv2d(view1, weight).sum().backward()  # the encoder can still train on the views
    assert weight.grad is not None


# --------------------------------------------------------------------------- the tool


@pytest.mark.slow  # a subprocess that imports torch
def test_show_augmentations_writes_the_png(tmp_path):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(
        "run:\n  name: tiny\ndata:\n  name: digits\n"
        "augment:\n  image_size: 16\n  crop_scale: [0.3, 1.0]\n  saturation: 0.0\n  hue: 0.0\n  grayscale_p: 0.0\n"
    )
    out = tmp_path / "grid.png"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sslkit.cli.show_augmentations",
            str(recipe),
            "augment.blur_p=1.0",
            "--out",
            str(out),
            "--images",
            "3",
            "--views",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert str(out.name) in result.stdout
    with Image.open(out) as grid:
        assert grid.format == "PNG"
        # 16x16 crops drawn 4x larger (64 px) in a 3 x (1 + 4) grid with 2 px padding.
        assert grid.size == (5 * 66 + 2, 3 * 66 + 2)


def test_show_augmentations_reports_a_bad_recipe_in_one_line(tmp_path, capsys):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("augment:\n  flip_p: 0.5\n")
    assert show_augmentations.main([str(recipe), "--out", str(tmp_path / "never.png")]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'augment.flip_p'" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "never.png").exists()


# --------------------------------------------------------------------------- view groups and multi-crop


def test_two_views_are_the_tensors_they_were_before_view_groups():
    """Sums of the views of a fixed seed, as the single two-view pipeline made them before view groups
    and local views existed: a two-view recipe trains step for step as it did."""
    images = random_images(6, 3, 20)
    cfg = AugmentConfig(image_size=16, crop_scale_view2=(0.3, 1.0), blur_p_view2=0.1, solarize_p_view2=0.2)
    for num_views, sums in ((2, [115.562113, -1339.185101]), (1, [1068.848427])):
        torch.manual_seed(1)
        views = TwoViewAugment(cfg, 3, (0.5,) * 3, (0.25,) * 3, num_views=num_views)(images)
        assert [round(view.double().sum().item(), 4) for view in views] == pytest.approx(sums, abs=1e-3)


def test_local_views_come_after_the_unchanged_global_views():
    images = random_images(5, 3, 20)
    whole = ImageBatch(images, torch.tensor([[20, 20]] * 5))
    two = TwoViewAugment(AugmentConfig(image_size=16), 3, *RGB_STATS)
    multi = TwoViewAugment(AugmentConfig(image_size=16, local_views=3, local_size=8), 3, *RGB_STATS)
    for batch in (images, whole):
        torch.manual_seed(2)
        expected = two(batch)
        torch.manual_seed(2)
        views = multi(batch)
        assert [tuple(view.shape) for view in views] == [(5, 3, 16, 16)] * 2 + [(5, 3, 8, 8)] * 3
        for view, reference in zip(views, expected):
            torch.testing.assert_close(view, reference, rtol=0, atol=0)
        assert not torch.equal(views[2], views[3]), "each local view draws its own crop"


def test_local_views_take_view_1s_settings_unless_their_own_keys_say_otherwise():
    cfg = AugmentConfig(image_size=16, local_views=2, local_size=8, blur_p_view2=0.1, solarize_p=0.2)
    local = TwoViewAugment(cfg, 3, *RGB_STATS).groups[1]
    assert dict(zip(local.step_names, local.step_probabilities)) == {
        "jitter": (0.8, 0.8),
        "grayscale": (0.2, 0.2),
        "blur": (0.5, 0.5),
        "solarize": (0.2, 0.2),
    }
    dino_like = dataclasses.replace(cfg, local_blur_p=1.0, local_solarize_p=0.0)
    local = TwoViewAugment(dino_like, 3, *RGB_STATS).groups[1]
    assert local.step_names == ["jitter", "grayscale", "blur"] and local.step_probabilities[2] == (1.0, 1.0)
    assert local.crop_scales == [(0.05, 0.4)] and local.size == 8


def test_show_augmentations_draws_the_local_views_after_the_global_ones(tmp_path):
    out = tmp_path / "grid.png"
    overrides = ["augment.local_views=2", "augment.local_size=8", "augment.hflip_p=0"]
    args = ["quickstart", *overrides, "--out", str(out), "--images", "2", "--views", "2"]
    assert show_augmentations.main(args) == 0
    with Image.open(out) as grid:
        # 16x16 views drawn 4x larger, the 8x8 local views enlarged to 16 first: 2 x (1 + 2 + 2) cells.
        assert grid.size == (5 * 66 + 2, 2 * 66 + 2)
