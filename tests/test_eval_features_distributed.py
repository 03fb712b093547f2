"""extract_features: one process (modes, dtypes, order) and two real processes launched with
``accelerate launch``, where the sharded loaders pad 13 samples to 16 and every sample must
still come back exactly once."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from sslkit.evaluation import extract_features


class IndexImages(Dataset):
    """Sample i is a (1, 2, 2) uint8 image filled with i, labelled i: features name their sample."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return torch.full((1, 2, 2), index, dtype=torch.uint8), index


def to_float(images):
    return images.float()


def index_encoder():
    # BatchNorm1d at its initial running statistics is the identity in eval mode, but in train
    # mode it would normalise each batch: features equal the sample index only in eval mode.
    return nn.Sequential(nn.Flatten(), nn.BatchNorm1d(4, eps=0.0))


def test_single_process_features_in_loader_order_float32_and_int64_on_cpu():
    encoder = index_encoder()
    features, labels = extract_features(encoder, DataLoader(IndexImages(13), batch_size=4), to_float)
    assert features.dtype == torch.float32 and labels.dtype == torch.int64
    assert features.device.type == "cpu" and labels.device.type == "cpu"
    torch.testing.assert_close(labels, torch.arange(13))
    torch.testing.assert_close(features, torch.arange(13.0)[:, None].expand(13, 4))


def test_modes_restored_per_submodule_and_no_graph_kept():
    encoder = index_encoder()
    encoder.train()
    encoder[1].eval()  # a caller froze the norm layer: it must stay frozen
    features, _ = extract_features(encoder, DataLoader(IndexImages(5), batch_size=2), to_float)
    assert encoder.training and not encoder[1].training and encoder[0].training
    assert not features.requires_grad


def test_long_loader_with_progress_bar_sees_every_batch():
    loader = DataLoader(IndexImages(50), batch_size=2)  # 25 batches: the bar is shown
    _, labels = extract_features(index_encoder(), loader, to_float)
    torch.testing.assert_close(labels, torch.arange(50))


def test_shuffling_distributed_sampler_in_one_process_comes_back_in_dataset_order():
    sampler = DistributedSampler(IndexImages(13), num_replicas=1, rank=0, shuffle=True, seed=0)
    assert list(sampler) != list(range(13))
    features, labels = extract_features(
        index_encoder(), DataLoader(IndexImages(13), batch_size=4, sampler=sampler), to_float
    )
    torch.testing.assert_close(labels, torch.arange(13))
    torch.testing.assert_close(features[:, 0], torch.arange(13.0))


def test_empty_loader_is_an_error_naming_the_loader():
    with pytest.raises(ValueError, match="loader"):
        extract_features(index_encoder(), [], to_float)


LAUNCHED_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, DistributedSampler
    from test_eval_features_distributed import IndexImages, index_encoder, to_float
    from sslkit.evaluation import extract_features

    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == 2, accelerator.num_processes
    dataset = IndexImages(13)  # 13 is not a multiple of 2 processes x batch 4: shards get padded
    encoder = index_encoder()
    result = {}

    prepared = accelerator.prepare(DataLoader(dataset, batch_size=4))
    # The trap is real here: a plain gather counts the padding.
    result["naive_gather_rows"] = sum(len(accelerator.gather(y)) for _, y in prepared)
    features, labels = extract_features(encoder, prepared, to_float, accelerator)
    result["prepared"] = [features[:, 0].tolist(), labels.tolist()]

    sampler = DistributedSampler(dataset, num_replicas=2, rank=accelerator.process_index, shuffle=True, seed=3)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler)
    features, labels = extract_features(encoder, loader, to_float, accelerator)
    result["distributed_sampler"] = [features[:, 0].tolist(), labels.tolist()]
    result["sampler_shard_size"] = len(sampler)

    features, labels = extract_features(encoder, DataLoader(dataset, batch_size=4), to_float, accelerator)
    result["unsharded"] = [features[:, 0].tolist(), labels.tolist()]

    try:
        double_sharded = accelerator.prepare(DataLoader(dataset, batch_size=4, sampler=sampler))
        extract_features(encoder, double_sharded, to_float, accelerator)
        result["double_sharding_error"] = None
    except ValueError as error:
        result["double_sharding_error"] = str(error)

    with open(f"{sys.argv[1]}/rank{accelerator.process_index}.json", "w") as file:
        json.dump(result, file)
    # Leave together and close the gloo group: a rank that exits while the other still tears
    # down its connections can abort ("terminate called without an active exception").
    accelerator.wait_for_everyone()
    accelerator.end_training()
    """
)


@pytest.mark.slow
def test_two_processes_count_every_sample_exactly_once(tmp_path):
    script = tmp_path / "extract.py"
    script.write_text(LAUNCHED_SCRIPT)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([tests_dir, os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    # `--multi_gpu` only picks accelerate's torchrun launcher; the script's Accelerator(cpu=True)
    # keeps both processes on the CPU with gloo. `--cpu` would start ONE process (accelerate's
    # simple launcher spawns several CPU processes only through mpirun).
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no",
        str(script), str(tmp_path),
    ]  # fmt: skip
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]

    for rank in range(2):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["naive_gather_rows"] == 16
        assert result["sampler_shard_size"] == 7  # 14 = 13 + 1 repeated sample
        for case in ("prepared", "distributed_sampler", "unsharded"):
            features, labels = result[case]
            assert labels == list(range(13)), (rank, case, labels)  # each once, in dataset order
            assert features == [float(i) for i in range(13)], (rank, case)
        assert "DistributedSampler" in result["double_sharding_error"]
