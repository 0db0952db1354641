"""One training step of a fully stochastic LeNet-300-100 vs a plain deterministic Adam step.

Model: LeNet-300-100 (784-300-100-10), every weight and bias random, mean-field Gaussian,
categorical likelihood, minibatch 256 out of N = 60000 (MNIST-sized synthetic data).

* baseline — plain PyTorch: ``nn`` LeNet-300-100, cross-entropy, ``torch.optim.Adam`` step;
* default — the library's default estimator for this model, backend ``graves`` (fused path of
  :class:`inference.variational.MeanFieldGuide`: one noise draw for all weights, closed-form
  KL gradients, fused Adam), with exactly the per-step work of the shared training loop
  (loss, finiteness checks, gradient norm, Adam, learning-rate schedule);
* lrt — the same with local reparameterisation (backend ``svi-lrt``);
* pyro — backend ``svi`` (stock Pyro ``AutoNormal`` through Pyro traces), for reference.

Repeats are interleaved (baseline, default, lrt, pyro, baseline, ...) and medians reported;
the ratios are medians of the per-round ratios.  Last line: ``svi_step_ratio <default ÷ baseline>``.

Usage: ``python benchmarks/svi_step.py [--rounds 30] [--steps 5] [--threads 1] [--no-pyro]``
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import pyro
import torch
import torch.nn.functional as F

from inference.backends.svi import SVIConfig
from inference.backends.variational import GravesConfig
from inference.elbo import elbo_terms
from inference.guides import build_guide
from inference.training import lr_scheduler as _scheduler
from zoo import BayesianNetwork, CategoricalLikelihood
from zoo.architectures import build_architecture

N, BATCH = 60000, 256


def _bnn():
    torch.manual_seed(0)
    net = build_architecture("lenet300100", 784, 10)
    return BayesianNetwork(net, stochastic="all", likelihood=CategoricalLikelihood(), output_dim=10)


def baseline_step(x, y):
    torch.manual_seed(0)
    net = build_architecture("lenet300100", 784, 10)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step():
        loss = F.cross_entropy(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def library_step(x, y, estimator, pyro_path=False):
    """The per-step work of :func:`inference.training.run_training_loop` for one backend."""
    bnn = _bnn()
    if pyro_path:
        config = SVIConfig(lr=1e-3)
        guide = build_guide("normal", bnn, init_scale=config.init_scale)
    else:
        config = GravesConfig(lr=1e-3, estimator=estimator)
        guide = build_guide("mean-field", bnn, **config.guide_kwargs())
    params = list(guide.parameters())
    optimizer = torch.optim.Adam(params, lr=config.lr, **({} if pyro_path else {"fused": True}))
    scheduler = _scheduler(optimizer, config, 10**6)
    beta = 1.0

    def step():
        if pyro_path:
            with pyro.validation_enabled(False):
                terms = elbo_terms(bnn.model, guide, x, y, N)
            loss = terms.loss(beta)
        else:
            ell, kl = guide.elbo_terms(bnn, x, y, N, estimator)
            loss = beta * kl - ell
        if not torch.isfinite(loss):
            raise RuntimeError("non-finite loss")
        optimizer.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, math.inf)
        if not torch.isfinite(norm):
            raise RuntimeError("non-finite gradient")
        optimizer.step()
        scheduler.step()

    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=5, help="steps per timed block")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-pyro", action="store_true", help="skip the (slow) stock Pyro reference")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, 784, generator=g)
    y = torch.randint(0, 10, (BATCH,), generator=g)
    steps = {
        "baseline": baseline_step(x, y),
        "default": library_step(x, y, "weights"),
        "lrt": library_step(x, y, "lrt"),
    }
    if not args.no_pyro:
        steps["pyro"] = library_step(x, y, None, pyro_path=True)
    for fn in steps.values():  # warm-up
        for _ in range(3):
            fn()
    times = {k: [] for k in steps}
    for _ in range(args.rounds):
        for name, fn in steps.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                fn()
            times[name].append((time.perf_counter() - start) / args.steps)
    print(f"LeNet-300-100 (784-300-100-10) fully stochastic, batch {BATCH}, N {N}, torch threads {args.threads}, "
          f"{args.rounds} interleaved rounds x {args.steps} steps")
    base = times["baseline"]
    for name, label in (
        ("baseline", "plain torch Adam step (deterministic)"),
        ("default", "graves default: fused weight sampling"),
        ("lrt", "svi-lrt: local reparameterisation"),
        ("pyro", "svi: stock Pyro AutoNormal"),
    ):
        if name not in times:
            continue
        ratio = statistics.median(t / b for t, b in zip(times[name], base))
        print(f"  {label:42s} median {statistics.median(times[name]) * 1e3:8.2f} ms   ratio {ratio:5.2f}")
    print(f"weight_sampling_ratio {statistics.median(t / b for t, b in zip(times['default'], base)):.2f}")
    print(f"lrt_ratio {statistics.median(t / b for t, b in zip(times['lrt'], base)):.2f}")
    print(f"svi_step_ratio {statistics.median(t / b for t, b in zip(times['default'], base)):.2f}")


if __name__ == "__main__":
    main()
