"""Seconds-long grids for tests (hidden from ``experiment --help``): ``smoke`` and ``smoke-24``."""
from __future__ import annotations

from lab.runs.spec import RunSpec

from .experiment import GridRun, run_key

__all__ = ["smoke_grid", "smoke_24_grid"]


def smoke_grid(fast: bool, data_root, seeds=(0, 1)) -> list:
    """Seconds-long grid for tests: a deterministic MLP, full SVI and last-layer SVI on its frozen body."""
    common = dict(data="toy1d", model="mlp", hidden=[8], epochs=3, num_samples=20)
    runs = []
    for seed in seeds:
        det = GridRun(run_key("det", seed), RunSpec(stochastic="none", seed=seed, **common),
                      {"variant": "det", "seed": seed})
        full = GridRun(run_key("full", seed), RunSpec(stochastic="all", seed=seed, **common),
                       {"variant": "full", "seed": seed})
        head = GridRun(run_key("head", seed), RunSpec(data="toy1d", model="mlp", hidden=[], stochastic="all",
                                                      seed=seed, epochs=3, num_samples=20),
                       {"variant": "frozen head", "seed": seed}, dataset="frozen-features", after=det.key)
        runs += [det, full, head]
    return runs


def smoke_24_grid(fast: bool, data_root) -> list:
    """The smoke grid on 8 seeds (24 runs): the kill-and-resume campaign (``benchmarks/kill_resume.py``)."""
    return smoke_grid(fast, data_root, seeds=range(8))
