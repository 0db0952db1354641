"""Forward pass of one variational dense layer (300 → 100, ReLU, batch 32) ÷ ``nn.Linear`` + ReLU.

Seed 002 Table 3.1 benchmarks exactly this (its Julia layers: 8.5× Flux ``Dense``).  Each
family's forward is the work the library does per layer and step in training, with trainable
parameters (autograd graph built, as in training), from the parameters to the activations:

* ``<family>/weights`` — σ from the family's parameterisation, one weight draw
  w = μ + σ ⊙ ε (as :class:`inference.variational.meanfield._MeanFieldDraw` does for sampled
  sites), ``relu(x wᵀ + b)``;
* ``<family>/lrt`` — σ² from the parameters and
  :func:`inference.variational.lrt.lrt_forward` (two matrix products and output-shaped noise).

The KL term is not part of a forward pass (it is computed once per step for all layers).
Repeats are interleaved and medians of per-round ratios reported.  The last line gives the
slowest family at its default training estimator (LRT for every family since issue 38; Graves was weights):
``variational_layer_forward_ratio <ratio>``.

Usage: ``python benchmarks/variational_layer_forward.py [--rounds 30] [--calls 200] [--threads 1]``
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from inference.variational.families import FAMILIES
from inference.variational.lrt import lrt_forward

IN, OUT, BATCH = 300, 100, 32
DEFAULT_ESTIMATOR = {"graves": "lrt", "sparse-vd": "lrt", "kingma-vd": "lrt"}


def _layer_forward(family_name: str, estimator: str, x: torch.Tensor):
    family = FAMILIES[family_name]
    torch.manual_seed(0)
    init = torch.nn.Linear(IN, OUT)
    w_loc = init.weight.detach().clone().requires_grad_()
    b_loc = init.bias.detach().clone().requires_grad_()
    w_s = family.init_param(w_loc.detach(), 1e-2).requires_grad_()
    b_s = family.init_param(b_loc.detach(), 1e-2).requires_grad_()
    module = torch.nn.Linear(IN, OUT)

    if estimator == "weights":
        def forward():
            w = torch.addcmul(w_loc, family.sigma(w_loc, w_s), torch.randn_like(w_loc))
            b = torch.addcmul(b_loc, family.sigma(b_loc, b_s), torch.randn_like(b_loc))
            return F.relu(F.linear(x, w, b))
    else:
        def forward():
            w_sigma, b_sigma = family.sigma(w_loc, w_s), family.sigma(b_loc, b_s)
            return F.relu(lrt_forward(module, x, w_loc, w_sigma * w_sigma, b_loc, b_sigma * b_sigma))

    return forward


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=200, help="forward calls per timed block")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    x = torch.randn(BATCH, IN, generator=torch.Generator().manual_seed(0))
    linear = torch.nn.Linear(IN, OUT)
    fns = {"nn.Linear": lambda: F.relu(linear(x))}
    for name in FAMILIES:
        for estimator in ("weights", "lrt"):
            fns[f"{name}/{estimator}"] = _layer_forward(name, estimator, x)
    for fn in fns.values():
        for _ in range(20):
            fn()
    times = {k: [] for k in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(args.calls):
                fn()
            times[name].append((time.perf_counter() - start) / args.calls)
    base = times["nn.Linear"]
    ratios = {k: statistics.median(t / b for t, b in zip(v, base)) for k, v in times.items()}
    print(f"forward {IN}->{OUT}, ReLU, batch {BATCH}, torch threads {args.threads}, "
          f"{args.rounds} interleaved rounds x {args.calls} calls")
    for name, t in times.items():
        default = " (default estimator)" if "/" in name and DEFAULT_ESTIMATOR[name.split("/")[0]] == name.split("/")[1] else ""
        print(f"  {name:22s} median {statistics.median(t) * 1e6:8.1f} us   ratio {ratios[name]:5.2f}{default}")
    worst = max(DEFAULT_ESTIMATOR, key=lambda f: ratios[f"{f}/{DEFAULT_ESTIMATOR[f]}"])
    print(f"slowest family at its default estimator: {worst}/{DEFAULT_ESTIMATOR[worst]}")
    print(f"variational_layer_forward_ratio {ratios[f'{worst}/{DEFAULT_ESTIMATOR[worst]}']:.2f}")


if __name__ == "__main__":
    main()
