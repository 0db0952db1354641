"""LeanAdam takes bitwise the steps of torch.optim.Adam; gradient_norm is get_total_norm."""
import math

import pytest
import torch

from inference.optim.lean_adam import LeanAdam, gradient_norm
from inference.optim.training import LoopOptions, lr_scheduler


def _trajectory(lean: bool, fused: bool, steps: int = 40) -> list:
    """Parameters after ``steps`` Adam steps with a cosine schedule on a small regression; the
    second parameter gets no gradient on every third step (its state appears late, then it skips)."""
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 3, generator=generator), torch.randn(32, generator=generator)
    w = torch.nn.Parameter(torch.randn(3, generator=generator))
    b = torch.nn.Parameter(torch.zeros(()))
    adam = torch.optim.Adam([w, b], lr=0.05, **({"fused": True} if fused else {}))
    optimizer = LeanAdam(adam) if lean else adam
    scheduler = lr_scheduler(adam, LoopOptions(lr=0.05, lr_schedule="cosine"), steps)
    for step in range(steps):
        optimizer.zero_grad()
        pred = x @ w + (b if step % 3 else 0.0)
        ((pred - y) ** 2).mean().backward()
        optimizer.step()
        scheduler.step()
    return [w.detach().clone(), b.detach().clone()]


@pytest.mark.parametrize("fused", [False, True])
def test_lean_adam_is_bitwise_adam(fused):
    reference, lean = _trajectory(False, fused), _trajectory(True, fused)
    for a, b in zip(reference, lean):
        assert torch.equal(a, b)
    assert not torch.equal(reference[1], torch.zeros(()))  # the late parameter did move


def test_lean_adam_rejects_other_optimisers():
    w = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match="one parameter group"):
        LeanAdam(torch.optim.SGD([w], lr=0.1))


def test_gradient_norm_is_total_norm():
    params = [torch.nn.Parameter(torch.randn(4, 5)), torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.ones(2))]
    sum(p.pow(3).sum() for p in params[:2]).backward()
    expected = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    assert torch.equal(gradient_norm(params), expected)
    params[0].grad[0, 0] = math.inf
    assert not torch.isfinite(gradient_norm(params))
