"""The recipe's sections: one typed dataclass per top-level key of a recipe, each field documented.

A recipe is a YAML file whose top-level sections match :class:`Config`'s fields. Each dataclass
says what its keys are, their types and defaults (the fields) and what they mean (the
``Attributes:`` docstring, read by :func:`field_docs`). Reading a recipe into them is
:mod:`sslkit.schema.reading`; checking names against the registries is :mod:`sslkit.config`.

>>> Config().train.grad_accum_steps
1
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunConfig:
    """Where a run writes, and how it starts.

    Attributes:
        name: The run's folder name under ``output_dir`` (a plain name: no ``/``, not ``.`` or ``..``).
        output_dir: The directory that holds the run directories; a run writes to ``output_dir/name``.
        seed: Seeds the weights, the data order of every epoch and the augmentation.
        resume: ``null`` starts fresh; ``auto`` continues from the latest checkpoint in the run directory
            (or starts fresh if there is none); a path continues from that checkpoint.
        init_from: A run directory, checkpoint or exported backbone whose backbone weights start this run
            (a later stage of the road from self-supervised to supervised); heads and optimizer start fresh.
            A relative path starts from the working directory.
    """

    name: str = "run"
    output_dir: str = "runs"
    seed: int = 0
    resume: str | None = None
    init_from: str | None = None


@dataclass
class DataConfig:
    """Which images to train on. Images reach the device as uint8; augmentation happens there.

    Attributes:
        name: The dataset: ``digits`` (scikit-learn's, bundled), ``fashion_mnist``, ``cifar10``, ``cifar100``,
            ``stl10``, ``imagefolder``, ``webdataset``, or a metric-learning benchmark split by class and evaluated
            by retrieval: ``cub200``, ``cars196``, ``sop``, ``inshop`` (see :mod:`sslkit.datasets`).
        root: Where the files are; ``null`` is the dataset's standard place (``fashion_mnist``:
            ``/usr/share/datasets/fashion-mnist``; torchvision's datasets: ``~/.cache/sslkit/datasets``).
            ``imagefolder`` needs it: a folder of images at any depth (unlabelled), or labelled
            ``root/train/<class>/`` and ``root/test/<class>/``. ``webdataset`` needs it: the tar shards, as a brace
            pattern (``shards/train-{000000..000015}.tar``), a folder of ``.tar`` files, or paths joined by ``::``.
            The benchmarks need it: the folder their archive unpacked to (``CUB_200_2011/``, the one holding
            ``cars_annos.mat``, ``Stanford_Online_Products/``, In-shop's).
        train_split: The split to train on; STL-10 also takes ``unlabeled`` and ``train+unlabeled``
            (self-supervised methods only).
        download: Download a torchvision dataset (CIFAR, STL-10) when its files are missing; nothing
            downloads unless this is true.
        image_size: ``imagefolder`` only: resize every image to this square at decode, the older behaviour
            (labelled ``<class>/`` folders; the aspect ratio is lost). ``null``: images keep their size and aspect
            ratio and the crops are drawn on the original image.
        num_workers: DataLoader worker processes (0: load in the training process; the in-memory datasets
            need none).
        holdout_classes: Class indices kept out of training; the runs add retrieval on them (Recall@K, MAP@R,
            NMI on unseen classes) next to kNN / linear accuracy on the seen ones.
        label_fraction: Keep the labels of this fraction (0 < f <= 1) of the labelled training split, the same
            number of images from every class (seeded by ``label_seed``); ``null``: every label. Supervised
            methods train on that subset only, the others see its labels only (the rest become -1), and the
            kNN memory and linear probe hold only the subset. The chosen indices are saved in the run
            directory as ``label_subset.json``.
        labels_per_class: Keep this many labelled images of every class instead (``null``: see
            ``label_fraction``; set at most one of the two).
        label_seed: The seed that picks the labelled subset; ``null``: ``run.seed``.
        val_fraction: Hold out this fraction (0 < f < 1) of every class of the labelled training split, the same
            images in every run, and measure every accuracy on them instead of the test split (which is then not
            read): a validation split for choosing settings (``sslkit-tune --validation``). The held-out images
            are trained on by no stream and are in no labelled subset; ``label_fraction`` still counts the whole
            split (0.01 of Fashion-MNIST: 600 labels). ``null``: evaluate on the test split.
        label_subset: Keep the labels of the images this label file names instead: ``sslkit-select``'s output
            (images chosen from their embeddings), or a run's ``label_subset.json``; its indices are into the
            labelled training split, and a file chosen on another dataset or split is refused. Used as
            ``label_fraction``'s subset is (and saved the same way); set at most one of the three in a recipe. One
            given on the command line replaces the recipe's (the start-up notes say so).
        max_size: ``imagefolder``, ``webdataset`` and the benchmarks: shrink an image whose longer side exceeds
            this at decode, keeping its aspect ratio (faster loading of large photos); ``null``: decode at full size.
        on_corrupt: ``imagefolder`` and ``webdataset``: what a corrupt or truncated image does. ``skip`` replaces it
            by another image, counts it and reports the count at the end of the epoch, and stops the run once more
            than 1% of the images are corrupt; ``error`` stops at the first one. (With ``data.image_size`` set, a
            corrupt image always stops the run.)
        decode: ``imagefolder`` and ``webdataset``: where JPEGs are decoded. ``auto``: on the accelerator when it
            is a CUDA device (nvJPEG, in batches; other formats fall back to the CPU), otherwise in the loader
            workers; ``cpu``: always in the loader workers.
        augment_in_workers: Where the training views are made. ``false``: the training process augments each
            uint8 batch on the accelerator. ``true``: each loader worker augments the batches it loads, on the
            CPU, with the randomness seeded by (``run.seed``, epoch, batch), so the views do not depend on
            ``data.num_workers`` and a resumed run sees the same ones (JPEGs are then decoded in the workers).
            ``auto``: ``true`` when the accelerator is the CPU and ``data.num_workers`` > 0, else ``false``.
        sampler: The training order. ``random``: a shuffle of every image each epoch. ``m_per_class``: class-balanced
            P x K batches for metric learning, ``train.batch_size / data.m_per_class`` distinct classes of
            ``data.m_per_class`` images each, every image about once an epoch (a class with fewer images than that
            is drawn with replacement); over several processes each takes its own classes. Needs a label for every
            training image.
        m_per_class: Images of each class in a batch with ``data.sampler=m_per_class`` (4 in "A Metric Learning
            Reality Check"); ``train.batch_size`` divided by the number of processes must be a multiple of it.
        class_split: ``imagefolder`` only: split the classes rather than the images, as the retrieval benchmarks
            do. Train on the first fraction (0 < f < 1) of the sorted class folders of ``root`` (or ``root/train``)
            and evaluate by retrieval (Recall@K, MAP@R, NMI) among the images of the others; ``null``: no split.
    """

    name: str = "digits"
    root: str | None = None
    train_split: str = "train"
    download: bool = False
    image_size: int | None = None
    num_workers: int = 0
    holdout_classes: list[int] = field(default_factory=list)
    label_fraction: float | None = None
    labels_per_class: int | None = None
    label_seed: int | None = None
    label_subset: str | None = None
    val_fraction: float | None = None
    max_size: int | None = None
    on_corrupt: str = "skip"
    decode: str = "auto"
    augment_in_workers: bool | str = "auto"
    sampler: str = "random"
    m_per_class: int = 4
    class_split: float | None = None


@dataclass
class AugmentConfig:
    """The SimCLR augmentation set, applied on the accelerator with per-sample parameters.

    ``*_view2`` fields, when set, give the second view its own setting: asymmetric, BYOL-style
    views (blur 1.0 / 0.1, solarize 0.0 / 0.2), or a weak view for a teacher and a strong one for
    its student (``method.name=distill``). The order of the steps is in :mod:`sslkit.augment`.

    ``local_*`` fields add multi-crop (SwAV, DINO): ``local_views`` smaller views of each image after the
    two global views, with view 1's settings except their size, crop scale and the two ``local_*_p``.

    Attributes:
        image_size: Output size of the random resized crop, training and evaluation alike (may upsample
            small images: 8x8 digits to 16x16).
        crop_scale: ``[low, high]``: the crop's area as a fraction of the image (``0 < low <= high <= 1``).
        crop_scale_view2: The second view's ``crop_scale``; ``null``: ``crop_scale``.
        crop_ratio: ``[low, high]``: the crop's aspect ratio (width / height).
        hflip_p: Probability of a horizontal flip.
        jitter_p: Probability of colour jitter (brightness, contrast, saturation, hue in random order).
        jitter_p_view2: The second view's jitter probability; ``null``: ``jitter_p``.
        brightness: Jitter strength: the brightness factor is drawn from ``[1 - b, 1 + b]``.
        contrast: Jitter strength: the contrast factor is drawn from ``[1 - c, 1 + c]``.
        saturation: Jitter strength: the saturation factor is drawn from ``[1 - s, 1 + s]`` (0 for grey images).
        hue: Jitter strength: the hue shift is drawn from ``[-h, h]`` (0 for grey images).
        grayscale_p: Probability of converting a view to grey.
        blur_p: Probability of a Gaussian blur (the second view too, unless ``blur_p_view2`` is set).
        blur_p_view2: The second view's blur probability; ``null``: ``blur_p``.
        blur_kernel: The blur's kernel size, odd and >= 3; 0: about 10% of ``image_size``, rounded to odd
            (SimCLR).
        blur_sigma: ``[low, high]``: the range the blur's sigma is drawn from.
        solarize_p: Probability of solarizing (inverting pixels above 0.5; BYOL).
        solarize_p_view2: The second view's solarize probability; ``null``: ``solarize_p``.
        normalize: Subtract the dataset's mean and divide by its standard deviation after augmenting.
        local_views: Multi-crop (SwAV, DINO): smaller views of each image after the two global views, for the
            methods that take them (every self-supervised method but ``nce``, and ``supcon``); 0: the two global
            views only.
        local_size: The local views' side in pixels, at most ``image_size`` (DINO: 96 for 224 px globals);
            required with ``local_views``.
        local_crop_scale: ``[low, high]``: the local crops' area as a fraction of the image (DINO: 0.05-0.4, with
            ``crop_scale`` 0.4-1 for the global views).
        local_blur_p: The local views' blur probability; ``null``: ``blur_p`` (DINO: 0.5).
        local_solarize_p: The local views' solarize probability; ``null``: ``solarize_p`` (DINO: 0).
    """

    image_size: int = 32
    crop_scale: tuple[float, float] = (0.08, 1.0)
    crop_scale_view2: tuple[float, float] | None = None
    crop_ratio: tuple[float, float] = (0.75, 4.0 / 3.0)
    hflip_p: float = 0.5
    jitter_p: float = 0.8
    jitter_p_view2: float | None = None
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.4
    hue: float = 0.1
    grayscale_p: float = 0.2
    blur_p: float = 0.5
    blur_p_view2: float | None = None
    blur_kernel: int = 0
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    solarize_p: float = 0.0
    solarize_p_view2: float | None = None
    normalize: bool = True
    local_views: int = 0
    local_size: int = 0
    local_crop_scale: tuple[float, float] = (0.05, 0.4)
    local_blur_p: float | None = None
    local_solarize_p: float | None = None


@dataclass
class ModelConfig:
    """Backbone and projection head.

    Attributes:
        backbone: ``resnet18``, ``resnet34`` or ``resnet50``: sslkit's torchvision ResNets (with ``width`` and
            ``cifar_stem``); any other name is a timm model (``vit_small_patch16_224``, ``convnext_tiny``,
            ``timm.list_models()``), built without pretrained weights and with ``kwargs``. A ``timm/`` prefix
            (``timm/resnet50``) picks timm's model where sslkit has one of the same name.
        cifar_stem: sslkit's ResNets: a 3x3 stride-1 first convolution and no max-pool, for small images
            (SimCLR's CIFAR stem); false: torchvision's 7x7 stride-2 convolution and max-pool.
        width: sslkit's ResNets: channels of the first stage (torchvision: 64); every stage scales with it. 16
            trains on a CPU.
        kwargs: timm models: arguments of ``timm.create_model`` (``{img_size: 32, patch_size: 4}`` for a ViT on
            32x32 images; ``depth``, ``embed_dim``, ...); a ViT's patch size must divide
            ``augment.image_size`` (and ``augment.local_size``; local views of another size need
            ``dynamic_img_size: true``, timm's interpolated position embeddings).
        projector_hidden: Hidden width of the MLP projection head.
        projector_out: Output (embedding) size of the projection head: what the loss sees.
        projector_layers: Linear layers in the projection head (1: a single linear map).
        channels_last: Run the model in channels-last (NHWC) memory format, the layout GPU convolutions prefer.
        sync_batchnorm: BatchNorm statistics over the global batch of every process (SimCLR's global BN,
            MoCo v3's SyncBN; :mod:`sslkit.models.sync_batchnorm`); the same as plain BatchNorm in one process.
        freeze_patch_embed: Patch-embedding models (ViT, ...): keep the patch projection at its random
            initialisation, never trained (MoCo v3's stability trick, Chen et al. 2021 section 4.2).
    """

    backbone: str = "resnet18"
    cifar_stem: bool = True
    width: int = 64
    kwargs: dict[str, Any] = field(default_factory=dict)
    projector_hidden: int = 2048
    projector_out: int = 128
    projector_layers: int = 2
    channels_last: bool = False
    sync_batchnorm: bool = False
    freeze_patch_embed: bool = False


@dataclass
class MethodConfig:
    """A method from :mod:`sslkit.methods` by name; other keys are its options.

    In a recipe the options sit beside the name (``method: {name: moco, queue_size: 4096}``,
    ``method.queue_size=4096`` on the command line). Each method declares its options (a dataclass
    in its module, ``Method.Options``) and checks them when a recipe loads; the tables below list
    every method's. A key that only another method reads is noted when training starts.

    Attributes:
        name: The method: ``simclr``, ``supcon``, ``supervised``, ``moco``, ``mocov3``, ``byol``, ``simsiam``,
            ``barlow_twins``, ``vicreg``, ``dino``, ``nce``, ``finetune`` or ``distill`` (see :mod:`sslkit.methods`).
        options: The method's own options, written as the other keys of the ``method`` section
            (``method.queue_size=4096``); unset ones take the method's defaults.
    """

    name: str = "simclr"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class LossConfig:
    """A loss from :mod:`sslkit.losses` by name; other keys are its constructor's arguments.

    In a recipe the arguments sit beside the name (``loss: {name: ntxent, temperature: 0.2}``,
    ``loss.temperature=0.2`` on the command line); they are checked against the loss's
    constructor. Every loss's arguments and defaults are listed in ``docs/losses.md``.

    Attributes:
        name: The loss's registry name (``ntxent``, ``supcon``, ``arcface``, ...); the method says which
            losses it trains with.
        kwargs: The loss's own arguments, written as the other keys of the ``loss`` section
            (``loss.temperature=0.2``, ``loss.margin=0.5``); unset ones take the loss's defaults.
    """

    name: str = "ntxent"
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule (a pure function of the step, see :mod:`sslkit.optim`).

    The schedule is a linear warm-up followed by a cosine decay to ``lr * min_lr_ratio``.

    Attributes:
        name: The optimizer: ``sgd``, ``adamw`` or ``lars``.
        lr: The base learning rate, before ``lr_scaling``.
        lr_scaling: ``none``, ``linear`` (``lr * batch / 256``) or ``sqrt`` (``lr * sqrt(batch / 256)``), with
            the global ``train.batch_size``; the scaled value is logged at the start.
        momentum: SGD and LARS momentum.
        weight_decay: Weight decay (decoupled for AdamW).
        betas: AdamW's ``[beta1, beta2]``.
        trust_coefficient: LARS's trust coefficient (eta).
        exclude_bias_and_norm: No weight decay (and no LARS adaptation) on biases and normalisation weights.
        warmup_epochs: Epochs of linear warm-up from 0 (fractions allowed; at most half the run).
        backbone_lr_scale: The backbone's learning rate is the scheduled rate times this (fine-tuning: often 0.1).
        head_lr_scale: A loss head's learning rate is the scheduled rate times this times what the head
            declares (Proxy-Anchor's proxies: 100).
        min_lr_ratio: The cosine decays to ``lr * min_lr_ratio``.
        layer_decay: Layer-wise learning-rate decay of the backbone (BEiT, MAE fine-tuning; 0.65-0.75 for a
            ViT): backbone layer ``i`` of ``0..L`` trains at ``layer_decay ** (L - i)`` times its rate, the heads
            at 1; 1: off. Layers as timm groups them (``group_matcher``): the stem (patch embedding) is 0, each
            block one more, the last block and final norm ``L``; for sslkit's ResNets the stem, then each
            residual block.
    """

    name: str = "sgd"
    lr: float = 0.3
    lr_scaling: str = "none"
    momentum: float = 0.9
    weight_decay: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    trust_coefficient: float = 0.001
    exclude_bias_and_norm: bool = True
    warmup_epochs: float = 10.0
    backbone_lr_scale: float = 1.0
    head_lr_scale: float = 1.0
    min_lr_ratio: float = 0.0
    layer_decay: float = 1.0


@dataclass
class TrainConfig:
    """The loop. ``batch_size`` is global: it is split over processes.

    Attributes:
        epochs: Epochs to train; raising it on a finished run and resuming (``run.resume=auto``) extends it.
        batch_size: The global batch: images per batch summed over processes (each process takes
            ``batch_size / processes``).
        freeze_backbone_epochs: Train only the heads for the first N epochs (no gradient reaches the backbone).
        grad_accum_steps: Batches whose gradients are summed into one optimizer step.
        mixed_precision: ``no``, ``fp16`` or ``bf16`` autocast.
        max_steps: Stop after this many optimizer steps (smoke runs); ``null``: no limit.
        log_every_steps: Log loss, learning rate, images/s and data-wait share every N steps.
        checkpoint_every_epochs: Save a checkpoint every N epochs.
        checkpoint_every_steps: Also save every N optimizer steps, for long epochs; 0: off.
        knn_every_epochs: Run the online kNN monitor every N epochs; 0: off.
        keep_checkpoints: How many of the latest checkpoints to keep.
        trackers: Experiment trackers that also get the metrics and the resolved config, through Accelerate:
            ``tensorboard`` (logs in the run directory), ``wandb`` (Weights & Biases; ``WANDB_MODE=offline``
            keeps it local), or any other tracker Accelerate supports; each needs its package installed.
        compile: Compile the method with ``torch.compile`` (through Accelerate, after DDP wraps it).
        compile_backend: ``torch.compile``'s backend: ``inductor`` generates fused kernels; ``aot_eager``
            only traces (checks a model compiles, without the code generation).
        compile_mode: ``torch.compile``'s mode: ``default``, ``reduce-overhead`` (CUDA graphs) or
            ``max-autotune``.
        threads: ``torch.set_num_threads`` per process; ``null``: torch's default, except where
            ``accelerate launch`` on a machine without a GPU pinned one thread: then each process gets its
            share of the cores (:mod:`sslkit.loop.launch`).
        stop_signals: Signals that stop a run cleanly (a cluster's preemption notice, SLURM's ``--signal``):
            every process finishes its step, all agree on one step, a checkpoint is saved and the run exits
            with status 75 so that a batch script can requeue it (``run.resume=auto`` continues exactly).
            ``[]``: signals keep their default action.
    """

    epochs: int = 100
    batch_size: int = 256
    freeze_backbone_epochs: int = 0
    grad_accum_steps: int = 1
    mixed_precision: str = "no"
    max_steps: int | None = None
    log_every_steps: int = 10
    checkpoint_every_epochs: int = 1
    checkpoint_every_steps: int = 0
    knn_every_epochs: int = 1
    keep_checkpoints: int = 2
    trackers: list[str] = field(default_factory=list)
    compile: bool = False
    compile_backend: str = "inductor"
    compile_mode: str = "default"
    threads: int | None = None
    stop_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1"])


@dataclass
class EvalDataConfig:
    """A labelled evaluation set other than the training data's own splits.

    Attributes:
        name: The evaluation dataset (any ``data.name`` with labelled ``train`` and ``test`` splits); ``null``:
            ``imagefolder`` when ``root`` is set, otherwise the training dataset's own splits.
        root: Where its files are (an ``imagefolder`` needs ``root/train/<class>/`` and ``root/test/<class>/``).
    """

    name: str | None = None
    root: str | None = None


@dataclass
class EvalConfig:
    """Evaluation at the end of a run and in ``sslkit-evaluate``, on the frozen backbone's features.

    Attributes:
        knn_k: Neighbours of the weighted kNN classifier (InstDisc's; k=200 is the usual CIFAR figure).
        knn_temperature: Temperature of the kNN vote weights ``exp(similarity / T)``.
        linear_epochs: Epochs of the linear probe; 0 skips it (kNN only).
        linear_lr: The linear probe's learning rate.
        linear_batch_size: The linear probe's batch size.
        linear_weight_decay: The linear probe's weight decay.
        compare_random_init: Also evaluate the same encoder at random init.
        compare_raw_pixels: Also evaluate raw pixels with the same kNN / linear probe (the floor to beat).
        batch_size: Batch size of the feature extraction.
        label_fraction: The labelled subset the kNN memory and linear probe use, as ``data.label_fraction``;
            ``null``: ``data.label_fraction``. Evaluates one run at several label fractions without retraining.
        labels_per_class: As ``data.labels_per_class``, for evaluation only; ``null``: ``data.labels_per_class``.
        recall_ks: The K of the retrieval Recall@K (``unseen_recall@K``): 1, 2, 4, 8 for CUB-200 and Cars196,
            1, 10, 100, 1000 for Stanford Online Products, 1, 10, 20, 30, 40, 50 for In-shop, as their papers
            report them.
        data: The labelled evaluation set (:class:`EvalDataConfig`): its ``train`` split is the kNN memory and the
            linear probe's training set, its ``test`` split measures them. Unset, the training dataset's own
            splits are used; a training set without labels (an unlabelled image folder, shards) and no
            ``eval.data`` skips the kNN monitor and the final evaluation.
    """

    knn_k: int = 200
    knn_temperature: float = 0.07
    linear_epochs: int = 100
    linear_lr: float = 0.1
    linear_batch_size: int = 512
    linear_weight_decay: float = 0.0
    compare_random_init: bool = False
    compare_raw_pixels: bool = False
    batch_size: int = 512
    label_fraction: float | None = None
    labels_per_class: int | None = None
    recall_ks: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    data: EvalDataConfig = field(default_factory=EvalDataConfig)


@dataclass
class Config:
    """A whole recipe: one section per dataclass above, each a top-level key of the YAML file.

    Attributes:
        run: Where the run writes and how it starts (:class:`RunConfig`).
        data: The dataset and its split (:class:`DataConfig`).
        augment: The two-view augmentation on the accelerator (:class:`AugmentConfig`).
        model: Backbone and projection head (:class:`ModelConfig`).
        method: How a batch becomes a loss, and the method's options (:class:`MethodConfig`).
        loss: The loss by registry name and its arguments (:class:`LossConfig`).
        optim: Optimizer and learning-rate schedule (:class:`OptimConfig`).
        train: The training loop (:class:`TrainConfig`).
        eval: Evaluation of the frozen encoder (:class:`EvalConfig`).
    """

    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


def field_docs(cls: type) -> dict[str, str]:
    """``{field: meaning}`` from the ``Attributes:`` section of a dataclass's docstring (Google style).

    Each entry is ``name: text`` (or ``name (type): text``), indented under ``Attributes:``; more
    deeply indented lines continue it. ``tools/config_table.py`` renders docs/config.md from these
    entries, and a test requires one for every field of every section, so a recipe key cannot be
    added without saying what it means.

    >>> field_docs(TrainConfig)["grad_accum_steps"]
    'Batches whose gradients are summed into one optimizer step.'
    """
    lines = (inspect.getdoc(cls) or "").splitlines()
    if "Attributes:" not in (line.strip() for line in lines):
        return {}
    start = [line.strip() for line in lines].index("Attributes:")
    base = len(lines[start]) - len(lines[start].lstrip())
    docs: dict[str, str] = {}
    entry_indent, name = None, None
    for line in lines[start + 1 :]:
        if not line.strip():
            if name is not None:
                break  # a blank line ends the section
            continue
        indent = len(line) - len(line.lstrip())
        if indent <= base:
            break  # the next section (Note:, Example:, ...) or unindented text
        if entry_indent is None:
            entry_indent = indent
        match = _ATTRIBUTE.match(line.strip()) if indent == entry_indent else None
        if match:
            name = match.group("name")
            docs[name] = (match.group("text") or "").strip()
        elif name is not None and indent > entry_indent:
            docs[name] = f"{docs[name]} {line.strip()}".strip()
        else:
            raise ValueError(f"{cls.__name__}: cannot read this Attributes line: {line.strip()!r}")
    return docs


_ATTRIBUTE = re.compile(r"^(?P<name>[A-Za-z_]\w*)\s*(?:\([^)]*\))?\s*:(?:\s+(?P<text>.*)|$)")
