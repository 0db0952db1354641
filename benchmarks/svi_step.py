"""One training step of every SVI-family backend on a fully stochastic LeNet-300-100 vs a plain Adam step.

Model: LeNet-300-100 (784-300-100-10), every weight and bias random (Normal(0, 1) prior),
mean-field variational family, categorical likelihood, minibatch 256 out of N = 60000
(MNIST-sized synthetic data).

* baseline — plain PyTorch: ``nn`` LeNet-300-100, cross-entropy, ``torch.optim.Adam`` step;
* one row per SVI-family backend — ``svi`` (Pyro's ``AutoNormal``; its ELBO path chosen as the
  backend chooses it, :func:`inference.variational.elbo_paths.choose_elbo_path`, normally ``fused``),
  ``graves``, ``svi-lrt``, ``sparse-vd``, ``kingma-vd`` (the fused paths of
  :class:`inference.variational.MeanFieldGuide`) and ``radial`` (its path chosen as the backend
  chooses it, normally ``fused``: :meth:`inference.variational.AutoRadial.elbo_terms`), each with its
  backend's default options, guide and particle and exactly the per-step work of the shared
  training loop (loss, finiteness checks, gradient norm, Adam — fused where the backend uses
  it —, learning-rate schedule);
* ``svi (pyro-trace)`` / ``radial (pyro-trace)`` — forced onto Pyro traces, for reference (not in
  the worst ratio);
* ``lrt-floor`` — the least a locally reparameterised step can cost, for reference (not in the worst
  ratio): every layer through :func:`inference.variational.lrt.lrt_forward` (two matrix products,
  √δ, one normal per output) with the means and δ's weights as plain parameters — no variational
  parameterisation, no KL — in the same training loop with fused Adam over both.  The svi-lrt,
  sparse-vd and kingma-vd rows are also printed as multiples of it.

Repeats are interleaved (baseline, svi, graves, ..., baseline, ...) and medians reported; a
ratio is the median of the per-round ratios to the baseline.  Last line:
``svi_step_ratio_worst <max over the backends of ratio>``.

Usage: ``python benchmarks/svi_step.py [--rounds 30] [--steps 5] [--threads 1] [--clock wall|cpu] [--no-trace-reference] [--backends svi graves ...] [--device cuda]``
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from inference.backends import BACKENDS
from inference.variational.elbo_paths import choose_elbo_path, elbo_particle
from inference.variational.guides import build_guide
from inference.optim.training import lr_scheduler, optimiser_step
from inference.variational.lrt import lrt_forward
from zoo import BayesianNetwork, CategoricalLikelihood
from zoo.architectures import build_architecture

N, BATCH = 60000, 256
SVI_FAMILY = ("svi", "graves", "svi-lrt", "sparse-vd", "kingma-vd", "radial")
LRT_ESTIMATORS = ("svi-lrt", "sparse-vd", "kingma-vd")


def _bnn(device):
    torch.manual_seed(0)
    net = build_architecture("lenet300100", 784, 10)
    return BayesianNetwork(net, stochastic="all", likelihood=CategoricalLikelihood(), output_dim=10).to(device)


def baseline_step(x, y):
    torch.manual_seed(0)
    net = build_architecture("lenet300100", 784, 10).to(x.device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step():
        loss = F.cross_entropy(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def _loop_step(particle, params, config, fused_adam: bool = True):
    """``step()``: one step of the shared training loop (:func:`~inference.optim.training.optimiser_step`: loss and
    gradient checks, Adam — fused or PyTorch's default —, schedule) with ``config``'s rate, particles and schedule."""
    optimizer = torch.optim.Adam(params, lr=config.lr, **({"fused": True} if fused_adam else {}))
    scheduler = lr_scheduler(optimizer, config, 10**6)

    def step():
        optimiser_step(particle, config.num_particles, 1.0, optimizer, scheduler, params, math.inf, 0, lambda: None)

    return step


def lrt_floor_step(x, y):
    """The LRT floor (module docstring): the means start at the network's weights and δ's weights at 1
    (positive for the benchmark's few hundred Adam steps of at most lr each)."""
    torch.manual_seed(0)
    linears = [m for m in build_architecture("lenet300100", 784, 10).to(x.device).modules() if isinstance(m, nn.Linear)]
    means = [nn.Parameter(p.detach().clone()) for m in linears for p in (m.weight, m.bias)]
    variance_weights = [nn.Parameter(torch.ones_like(p)) for p in means]

    def particle():
        h = x
        for i, module in enumerate(linears):
            h = lrt_forward(module, h, means[2 * i], variance_weights[2 * i], means[2 * i + 1], variance_weights[2 * i + 1])
            h = F.relu(h) if i < len(linears) - 1 else h
        return -F.cross_entropy(h, y, reduction="sum") * (N / x.shape[0]), h.new_zeros(())

    return _loop_step(particle, means + variance_weights, BACKENDS["svi-lrt"].Config(lr=1e-3))


def backend_step(x, y, name: str, **options):
    """The per-step work of :func:`inference.optim.training.run_training_loop` (:func:`~inference.optim.training.optimiser_step`) for backend ``name``.

    Returns ``(step, label)``; the guide, particle and Adam variant are the backend's own.
    """
    backend = BACKENDS[name]
    bnn = _bnn(x.device)
    config = backend.Config(lr=1e-3, **options)
    config.validate()
    if name == "svi":
        path, _ = choose_elbo_path(bnn, config)
        guide = build_guide(config.guide, bnn, init_scale=config.init_scale, **(config.guide_options or {}))
        particle, fused_adam, label = elbo_particle(bnn, path), path == "fused", f"svi ({path})"
    else:
        guide = build_guide(backend.guide_name, bnn, **backend._guide_kwargs(config))
        particle, fused_adam, label = backend._particle(bnn, config), True, name
        if hasattr(config, "estimator"):
            label += f" ({config.estimator})"
        if hasattr(config, "elbo_path"):
            label += f" ({backend._extra_info(bnn, guide, config)['elbo_path']})"
    params = list(guide.parameters()) + bnn.deterministic_parameters()
    return _loop_step(lambda: particle(guide, x, y, N), params, config, fused_adam), label


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=5, help="steps per timed block")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall: perf_counter; cpu: this process's CPU time (steadier on a shared machine)")
    parser.add_argument("--no-trace-reference", action="store_true", help="skip svi forced onto Pyro traces")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (on CUDA each timed block ends with a synchronize)")
    parser.add_argument("--backends", nargs="+", choices=SVI_FAMILY, default=list(SVI_FAMILY),
                        help="time only these (the worst ratio is then over these only)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, 784, generator=g).to(args.device)
    y = torch.randint(0, 10, (BATCH,), generator=g).to(args.device)
    sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
    steps = {"baseline": (baseline_step(x, y), "plain torch Adam step (deterministic)")}
    for name in args.backends:
        steps[name] = backend_step(x, y, name)
    for name in ("svi", "radial"):
        if not args.no_trace_reference and name in args.backends:
            steps[f"{name}-trace"] = backend_step(x, y, name, elbo_path="pyro-trace")
    lrt_rows = [name for name in LRT_ESTIMATORS if name in args.backends]
    if lrt_rows:
        steps["lrt-floor"] = (lrt_floor_step(x, y), "LRT floor: no parameterisation, no KL")
    for fn, _ in steps.values():  # warm-up
        for _ in range(3):
            fn()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    times = {k: [] for k in steps}
    for _ in range(args.rounds):
        for name, (fn, _) in steps.items():
            sync()
            start = clock()
            for _ in range(args.steps):
                fn()
            sync()
            times[name].append((clock() - start) / args.steps)
    print(f"LeNet-300-100 (784-300-100-10) fully stochastic, batch {BATCH}, N {N}, device {x.device}, torch threads {args.threads}, "
          f"{args.rounds} interleaved rounds x {args.steps} steps, {args.clock} clock")
    base = times["baseline"]
    ratios = {}
    for name, (_, label) in steps.items():
        ratios[name] = statistics.median(t / b for t, b in zip(times[name], base))
        print(f"  {name:12s} {label:40s} median {statistics.median(times[name]) * 1e3:8.2f} ms   ratio {ratios[name]:5.2f}")
    if lrt_rows:
        print("LRT estimators as multiples of the LRT floor: "
              + ", ".join(f"{name} {ratios[name] / ratios['lrt-floor']:.2f}" for name in lrt_rows))
        print(f"lrt_floor_ratio {ratios['lrt-floor']:.2f}")
    worst = max(args.backends, key=ratios.get)
    if "svi" in ratios:
        print(f"svi_step_ratio_default {ratios['svi']:.2f}")
    print(f"worst backend: {worst}")
    print(f"svi_step_ratio_worst {ratios[worst]:.2f}")


if __name__ == "__main__":
    main()
