"""The retrieval benchmarks read from small trees written here in each archive's real layout, their class
splits, data.class_split on an image folder, and evaluation by retrieval only."""

import numpy as np
import pytest
import torch
from PIL import Image

from sslkit.config import config_from_dict
from sslkit.datasets import build_dataset, build_splits
from sslkit.errors import UserError


def write_image(path, value: int, size=(6, 5)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (value, value, value)).save(path)


def write_cub(root, classes=4, per_class=3):
    """CUB_200_2011/: images.txt, image_class_labels.txt, classes.txt and images/<class>/<file>.jpg."""
    folder = root / "CUB_200_2011"
    images, labels, names = [], [], []
    # The split is by class number: 1-100 train, 101-200 test. A small tree uses classes 99-102.
    numbers = [99 + c for c in range(classes)]
    for c, number in enumerate(numbers):
        name = f"{number:03d}.Bird_{number}"
        names.append(f"{number} {name}")
        for i in range(per_class):
            image_id = len(images) + 1
            path = f"{name}/Bird_{number}_{i}.jpg"
            write_image(folder / "images" / path, 10 * c + i)
            images.append(f"{image_id} {path}")
            labels.append(f"{image_id} {number}")
    (folder / "images.txt").write_text("\n".join(images) + "\n")
    (folder / "image_class_labels.txt").write_text("\n".join(labels) + "\n")
    (folder / "classes.txt").write_text("\n".join(names) + "\n")
    return folder


def test_cub200_splits_classes_1_to_100_from_101_to_200(tmp_path):
    write_cub(tmp_path)
    train = build_dataset("cub200", "train", str(tmp_path))  # the folder above CUB_200_2011/ will do
    test = build_dataset("cub200", "test", str(tmp_path / "CUB_200_2011"))
    assert train.classes == ["099.Bird_99", "100.Bird_100"] and train.labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert test.classes == ["101.Bird_101", "102.Bird_102"] and test.labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert test.paths[0].name == "Bird_101_0.jpg"
    images, labels = train.__getitems__([0, 4])
    assert images.pixels[0, :, 0, 0].tolist() == [0] * 3 and images.pixels[1, :, 0, 0].tolist() == [11] * 3
    assert images.sizes.tolist() == [[5, 6], [5, 6]]  # images keep their own size


def test_cars196_reads_the_annotation_mat(tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    rows = []
    for k, number in enumerate([1, 98, 99, 196, 98]):
        path = f"car_ims/{k + 1:06d}.jpg"
        write_image(tmp_path / path, 40 * k)
        # The real file's fields: bbox_x1, bbox_y1, bbox_x2, bbox_y2, class, test (a per-image flag not used).
        rows.append((path, 0, 0, 5, 4, number, k % 2))
    fields = [("relative_im_path", "O"), ("bbox_x1", "O"), ("bbox_y1", "O"), ("bbox_x2", "O"), ("bbox_y2", "O")]
    annotations = np.array(rows, dtype=[*fields, ("class", "O"), ("test", "O")])
    names = np.array([f"Car {i}" for i in range(1, 197)], dtype=object)
    scipy_io.savemat(tmp_path / "cars_annos.mat", {"annotations": annotations, "class_names": names})

    train = build_dataset("cars196", "train", str(tmp_path))
    test = build_dataset("cars196", "test", str(tmp_path))
    assert [p.name for p in train.paths] == ["000001.jpg", "000002.jpg", "000005.jpg"]
    assert train.labels.tolist() == [0, 1, 1] and len(train.classes) == 2
    assert [p.name for p in test.paths] == ["000003.jpg", "000004.jpg"] and test.labels.tolist() == [0, 1]
    (tmp_path / "cars_annos.mat").write_bytes(b"not a mat file")
    with pytest.raises(UserError, match="cannot read .*cars_annos.mat"):
        build_dataset("cars196", "train", str(tmp_path))


def write_sop(root):
    """Stanford_Online_Products/: Ebay_train.txt, Ebay_test.txt and <super>_final/<file>.JPG."""
    folder = root / "Stanford_Online_Products"
    header = "image_id class_id super_class_id path"
    for file, classes in (("Ebay_train.txt", [1, 1, 2, 2, 2]), ("Ebay_test.txt", [11319, 11319, 11320])):
        lines = [header]
        for i, c in enumerate(classes):
            path = f"bicycle_final/{c}_{i}.JPG"
            write_image(folder / path, i)
            lines.append(f"{i + 1} {c} 1 {path}")
        (folder / file).write_text("\n".join(lines) + "\n")
    return folder


def test_sop_reads_its_two_lists(tmp_path):
    write_sop(tmp_path)
    train, test = (build_dataset("sop", split, str(tmp_path)) for split in ("train", "test"))
    assert train.labels.tolist() == [0, 0, 1, 1, 1] and train.classes == ["1", "2"]
    assert test.labels.tolist() == [0, 0, 1] and test.classes == ["11319", "11320"]
    assert test.paths[2].name == "11320_2.JPG"
    (tmp_path / "Stanford_Online_Products" / "Ebay_test.txt").write_text("image_id class_id\n1 2 3\n")
    with pytest.raises(UserError, match="line 2 has 3 fields, not 4"):
        build_dataset("sop", "test", str(tmp_path))


def write_inshop(root):
    """Eval/list_eval_partition.txt (a count, a header, rows) and Img/img/<gender>/<kind>/<item>/<file>.jpg."""
    rows = [
        ("id_00000001", "train"),
        ("id_00000001", "train"),
        ("id_00000003", "train"),
        ("id_00000002", "query"),
        ("id_00000002", "gallery"),
        ("id_00000004", "gallery"),
        ("id_00000004", "query"),
        ("id_00000004", "gallery"),
    ]
    lines = [str(len(rows)), "image_name item_id evaluation_status"]
    for i, (item, status) in enumerate(rows):
        path = f"img/WOMEN/Dresses/{item}/{i:02d}_1_front.jpg"
        write_image(root / "Img" / path, 20 * i)
        lines.append(f"{path}   {item}   {status}")
    (root / "Eval").mkdir()
    (root / "Eval" / "list_eval_partition.txt").write_text("\n".join(lines) + "\n")


def test_inshop_numbers_the_items_of_query_and_gallery_together(tmp_path):
    write_inshop(tmp_path)
    train, query, gallery = (build_dataset("inshop", split, str(tmp_path)) for split in ("train", "query", "gallery"))
    assert train.labels.tolist() == [0, 0, 1] and train.classes == ["id_00000001", "id_00000003"]
    assert query.classes == gallery.classes == ["id_00000002", "id_00000004"]
    assert query.labels.tolist() == [0, 1] and gallery.labels.tolist() == [0, 1, 1]
    assert gallery.paths[0].name == "04_1_front.jpg" and gallery.paths[0].is_file()
    with pytest.raises(UserError, match="no split 'test'"):
        build_dataset("inshop", "test", str(tmp_path))


def test_missing_files_name_what_and_where(tmp_path):
    with pytest.raises(UserError, match="cub200 needs data.root"):
        build_dataset("cub200", "train")
    with pytest.raises(UserError, match="data.image_size applies to imagefolder only, not cub200"):
        build_dataset("cub200", "train", str(tmp_path), image_size=64)
    with pytest.raises(UserError, match=r"sop: Ebay_train.txt not found in .* or .*Stanford_Online_Products"):
        build_dataset("sop", "train", str(tmp_path))
    folder = write_cub(tmp_path)
    (folder / "images" / "099.Bird_99" / "Bird_99_0.jpg").unlink()
    with pytest.raises(UserError, match="Bird_99_0.jpg is missing"):
        build_dataset("cub200", "train", str(tmp_path))


# --------------------------------------------------------------------------- splits and evaluation


def test_a_benchmark_trains_on_its_classes_and_retrieves_among_the_others(tmp_path):
    write_cub(tmp_path, classes=4)
    splits = build_splits(config_from_dict({"data": {"name": "cub200", "root": str(tmp_path)}}))
    assert splits.memory is None and splits.test is None and splits.gallery is None
    assert splits.info.num_classes == 2 and len(splits.train) == 6  # a head gets the training classes only
    assert splits.unseen.classes == ["101.Bird_101", "102.Bird_102"]

    write_inshop(tmp_path / "inshop")
    splits = build_splits(config_from_dict({"data": {"name": "inshop", "root": str(tmp_path / "inshop")}}))
    assert (len(splits.train), len(splits.unseen), len(splits.gallery)) == (3, 2, 3)


def test_class_split_trains_on_the_first_classes_of_an_image_folder(tmp_path):
    for c, name in enumerate(["ant", "bee", "cat", "dog", "eel"]):
        for i in range(2):
            write_image(tmp_path / name / f"{i}.png", 10 * c + i)
    (tmp_path / "fox").mkdir()  # no images: not a class
    cfg = config_from_dict({"data": {"name": "imagefolder", "root": str(tmp_path), "class_split": 0.5}})
    splits = build_splits(cfg)
    assert splits.train.classes == ["ant", "bee"] and splits.train.labels.tolist() == [0, 0, 1, 1]  # round(2.5)
    assert splits.unseen.classes == ["cat", "dog", "eel"] and splits.unseen.labels.tolist() == [0, 0, 1, 1, 2, 2]
    assert [p.parent.name for p in splits.unseen.paths] == ["cat", "cat", "dog", "dog", "eel", "eel"]
    assert splits.info.num_classes == 2 and splits.memory is None


@pytest.mark.parametrize(
    "data, words",
    [
        ({"name": "digits", "class_split": 0.5}, ["data.class_split=0.5", "imagefolder"]),
        ({"name": "imagefolder", "class_split": 1.0}, ["strictly between 0 and 1"]),
    ],
)
def test_class_split_mistakes_are_one_line(data, words):
    with pytest.raises(UserError) as error:
        config_from_dict({"data": data})
    message = str(error.value)
    assert all(word in message for word in words) and "\n" not in message, message


def test_a_second_class_split_is_refused(tmp_path):
    write_cub(tmp_path)
    cfg = config_from_dict({"data": {"name": "cub200", "root": str(tmp_path), "holdout_classes": [1]}})
    with pytest.raises(UserError, match="disjoint classes already; drop data.holdout_classes"):
        build_splits(cfg)


def test_retrieval_only_evaluation_uses_the_gallery(tmp_path):
    from accelerate import Accelerator

    from sslkit.augment import EvalTransform
    from sslkit.evaluation import RunEvaluator

    write_inshop(tmp_path)
    data = {"name": "inshop", "root": str(tmp_path)}
    cfg = config_from_dict({"data": data, "augment": {"image_size": 4}, "eval": {"recall_ks": [1, 10]}})
    splits = build_splits(cfg)
    info = splits.info
    preprocess = EvalTransform(4, info.channels, info.mean, info.std, False)
    evaluator = RunEvaluator(cfg, splits, preprocess, Accelerator(cpu=True))
    assert evaluator.available and not evaluator.classifies

    # An image's feature is its grey value as an angle, so cosine similarity orders images by grey value. Query
    # 60 (item 2) is nearest to gallery 80 (item 2), query 120 (item 4) to 100 and 140 (item 4): perfect retrieval,
    # which the queries alone could not give (no two share an item).
    class Grey(torch.nn.Module):
        def forward(self, images):
            angle = images.mean(dim=(1, 2, 3)) / images.new_tensor(255.0 if images.max() > 1 else 1.0)
            return torch.stack([torch.cos(angle), torch.sin(angle)], dim=1)

    results = evaluator.evaluate(Grey())
    assert {"unseen_recall@1", "unseen_recall@10", "unseen_map@r", "unseen_nmi"} <= set(results)
    assert "knn_top1" not in results and "unseen_recall@2" not in results  # eval.recall_ks sets the K
    assert results["unseen_recall@1"] == results["unseen_map@r"] == 1.0


# --------------------------------------------------------------------------- ImageNet weights and the recipes


@pytest.mark.parametrize("source", ["torchvision", "timm"])
def test_init_from_an_imagenet_state_dict_on_disk(tmp_path, source):
    """A torchvision .pth or a timm .safetensors state dict starts the backbone (ResNet-18 here: small)."""
    from sslkit import models
    from sslkit.models import weights

    if source == "torchvision":
        torchvision = pytest.importorskip("torchvision")
        state, path, backbone = torchvision.models.resnet18().state_dict(), tmp_path / "resnet18.pth", "resnet18"
        torch.save(state, path)
    else:
        timm = pytest.importorskip("timm")
        from safetensors.torch import save_file

        state, path, backbone = (
            timm.create_model("resnet18").state_dict(),
            tmp_path / "model.safetensors",
            "timm/resnet18",
        )
        save_file(state, str(path))
    cfg = config_from_dict({"model": {"backbone": backbone, "cifar_stem": False, "width": 64}})
    model = models.backbone_from_config(cfg.model, 3)
    assert weights.init_backbone(model, path) == ["fc.bias", "fc.weight"]  # the classifier, reported unused
    assert torch.equal(model.state_dict()["layer4.1.conv2.weight"], state["layer4.1.conv2.weight"])


@pytest.mark.parametrize(
    "recipe", [f"{name}_proxy_anchor" for name in ("cub200", "cars196", "sop", "inshop")] + ["cub200_multi_similarity"]
)
def test_each_benchmark_recipe_fits_torchvision_resnet50_weights(recipe):
    from pathlib import Path

    import torchvision

    from sslkit import models
    from sslkit.config import load_config
    from sslkit.models import weights

    cfg = load_config(Path(__file__).parents[1] / "recipes" / f"{recipe}.yaml")
    assert recipe.startswith(cfg.data.name) and cfg.data.sampler == "m_per_class" and cfg.train.batch_size % 5 == 0
    with torch.device("meta"):  # shapes only, no memory
        own = models.backbone_from_config(cfg.model, 3).state_dict()
        imagenet = torchvision.models.resnet50().state_dict()
    wrong_shape, missing, unused = weights.state_differences(imagenet, own)
    assert not wrong_shape and not missing and sorted(unused) == ["fc.bias", "fc.weight"]


@pytest.mark.slow
def test_a_benchmark_run_from_imagenet_weights_reports_retrieval_of_both(tmp_path):
    """pretrain.py on a small CUB tree: P x K batches, a torchvision state dict as init_from, retrieval rows."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    torchvision = pytest.importorskip("torchvision")
    root = Path(__file__).parents[1]
    write_cub(tmp_path / "data", classes=6, per_class=4)
    torch.save(torchvision.models.resnet18().state_dict(), tmp_path / "resnet18.pth")
    command = [
        sys.executable, str(root / "sslkit" / "pretrain.py"), str(root / "recipes" / "cub200_proxy_anchor.yaml"),
        f"run.output_dir={tmp_path}", "run.name=cub", f"run.init_from={tmp_path / 'resnet18.pth'}",
        f"data.root={tmp_path / 'data'}", "data.num_workers=0", "data.m_per_class=2", "train.batch_size=4",
        "train.epochs=2", "train.mixed_precision='no'", "train.threads=1", "model.backbone=resnet18",
        "model.projector_out=16", "model.channels_last=false", "augment.image_size=16",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "fc.bias, fc.weight" in result.stdout  # the classifier of the ImageNet weights, unused
    results = json.loads((tmp_path / "cub" / "results.json").read_text())["results"]
    for row in ("trained", "start (init_from)"):
        assert 0 <= results[row]["unseen_recall@1"] <= 1 and "knn_top1" not in results[row]
