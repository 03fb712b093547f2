"""The key queue (order, wrap-around, global keys across two real processes) and the momentum update."""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_in_processes
from torch import nn

from sslkit.methods.momentum import freeze, update_momentum
from sslkit.methods.queue import KeyQueue


def numbered(start: int, count: int, dim: int = 2) -> torch.Tensor:
    """Keys whose every entry is their own serial number: easy to read back."""
    return torch.arange(start, start + count, dtype=torch.float32)[:, None].repeat(1, dim)


def serials(queue: KeyQueue) -> list[int]:
    return queue.keys[:, 0].long().tolist()


def test_queue_keeps_the_most_recent_keys_and_wraps_around():
    queue = KeyQueue(size=5, dim=2)
    assert queue.negatives().shape == (0, 2)  # nothing to contrast with yet
    queue.enqueue(numbered(1, 2))
    assert queue.negatives().tolist() == numbered(1, 2).tolist() and int(queue.ptr) == 2
    queue.enqueue(numbered(3, 2))
    assert serials(queue) == [1, 2, 3, 4, 0] and int(queue.ptr) == 4 and queue.negatives().shape == (4, 2)
    queue.enqueue(numbered(5, 2))  # key 5 fills the last row, key 6 overwrites the oldest (1)
    assert serials(queue) == [6, 2, 3, 4, 5] and int(queue.ptr) == 1 and int(queue.filled) == 5
    assert sorted(queue.negatives()[:, 0].tolist()) == [2, 3, 4, 5, 6]  # the 5 most recent


def test_a_batch_larger_than_the_queue_keeps_its_newest_keys():
    queue = KeyQueue(size=3, dim=2)
    queue.enqueue(numbered(1, 1))
    queue.enqueue(numbered(10, 7))  # 10..16: only 14, 15, 16 survive, written from row 1 on
    assert serials(queue) == [16, 14, 15] and int(queue.ptr) == 1
    assert sorted(queue.negatives()[:, 0].tolist()) == [14, 15, 16]


def test_queue_is_state_and_rejects_wrong_width():
    queue = KeyQueue(size=4, dim=3)
    assert set(queue.state_dict()) == {"keys", "ptr", "filled"}
    with pytest.raises(ValueError, match=r"\(n, 3\)"):
        queue.enqueue(torch.zeros(2, 5))


def _enqueue_per_rank(rank: int, world: int) -> dict:
    queue = KeyQueue(size=7, dim=2)
    for step in range(3):  # 3 steps x 2 processes x 2 keys = 12 keys into 7 rows
        queue.enqueue(numbered(100 * step + 10 * rank, 2))
    return {"keys": queue.keys, "ptr": int(queue.ptr), "filled": int(queue.filled)}


@pytest.mark.slow
def test_two_processes_enqueue_the_same_global_keys_in_rank_order():
    results = run_in_processes(_enqueue_per_rank)
    # Global keys in order: step 0: 0, 1 (rank 0), 10, 11 (rank 1); step 1: 100, 101, 110, 111; step 2: 200, ...
    # 12 keys into 7 rows: the 8th to 12th (111, 200, 201, 210, 211) overwrote rows 0-4.
    expected = [111, 200, 201, 210, 211, 101, 110]
    for result in results:
        assert result["keys"][:, 0].long().tolist() == expected
        assert result["ptr"] == 12 % 7 and result["filled"] == 7
    assert torch.equal(results[0]["keys"], results[1]["keys"])


def small_net() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


@pytest.mark.parametrize("m", [0.0, 0.3, 0.99, 1.0])
def test_update_momentum_is_the_ema_formula_and_copies_buffers(m):
    torch.manual_seed(0)
    online, target = small_net(), small_net()
    online[1](torch.randn(8, 4))  # give the online BatchNorm running statistics of its own
    before = [p.clone() for p in target.parameters()]
    update_momentum(online, target, m)
    for old, new, source in zip(before, target.parameters(), online.parameters()):
        torch.testing.assert_close(new, m * old + (1 - m) * source, rtol=0, atol=1e-6)
        if m == 1.0:
            assert torch.equal(new, old)  # unchanged, exactly
        if m == 0.0:
            assert torch.equal(new, source)  # copied, exactly
    for name, buffer in target.named_buffers():
        assert torch.equal(buffer, dict(online.named_buffers())[name]), name


def test_update_momentum_rejects_bad_momentum_and_mismatched_networks():
    with pytest.raises(ValueError, match="m must be in"):
        update_momentum(small_net(), small_net(), 1.5)
    with pytest.raises(ValueError, match="same structure"):
        update_momentum(small_net(), nn.Linear(3, 4), 0.5)


def test_freeze_turns_off_gradients_but_keeps_the_state():
    net = freeze(small_net())
    assert not any(p.requires_grad for p in net.parameters())
    assert "0.weight" in net.state_dict()
    assert net(torch.randn(4, 3)).grad_fn is None
