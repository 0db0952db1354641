"""Assertion shared by the tests of zoo.data (imported by tests/zoo/data/)."""

import torch


def assert_train_standardised(ds, dims=0):
    """Training inputs have mean 0 and sd 1 (0 for a constant column) over ``dims``; targets too."""
    x = ds.x_train.double()
    assert torch.allclose(x.mean(dims), torch.zeros(()).double(), atol=1e-5)
    sd = x.std(dims, unbiased=False)
    assert torch.all(((sd - 1).abs() < 1e-4) | (sd < 1e-6))  # constant columns stay 0
    if ds.task == "regression":
        assert torch.allclose(ds.y_train.double().mean(0), torch.zeros(()).double(), atol=1e-5)
        assert torch.allclose(ds.y_train.double().std(0, unbiased=False), torch.ones(()).double(), atol=1e-4)
