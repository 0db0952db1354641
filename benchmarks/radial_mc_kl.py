"""Memory and time of one Radial training step vs the number M of MC draws of the prior cross-entropy.

Model: LeNet-300-100 (784-300-100-10), every weight and bias random with a Radial posterior
(:class:`inference.variational.AutoRadial`), N(0, 1) prior, categorical likelihood, minibatch 64
of MNIST-sized synthetic data.  One step = draw weights from the guide, forward, cross-entropy
scaled to N = 60000, Σ_site ``guide.site_kl`` (−entropy + M-draw cross-entropy), backward, Adam.
Estimators: ``naive`` (autograd through all M weight draws) and ``ours`` (seed 004: per-weight
ξ̄ and (ξ²)‾ accumulated without gradient, graph independent of M).

* Peak memory: each (estimator, M) runs in a fresh subprocess; on the CPU the peak resident set
  size (``ru_maxrss``) is reported, total and as the increase over the process's size before
  its first step; on CUDA ``torch.cuda.max_memory_allocated``.
* Step time: all configurations in one process, repeats interleaved, medians.

Last line: ``radial_mem_ratio_M1000 <ours at M=1000 ÷ ours at M=1>`` (peak memory; goal ≤ 1.1).

Usage: ``python benchmarks/radial_mc_kl.py [--device cpu|cuda] [--rounds 5] [--threads 1] [--chunk-elements 1048576]``
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import pyro
import torch
import torch.nn.functional as F
from pyro import poutine
from torch.func import functional_call

from inference.variational.guides import build_guide
from inference.variational.radial import DEFAULT_CHUNK_ELEMENTS
from zoo import BayesianNetwork, CategoricalLikelihood
from zoo.architectures import build_architecture

N, BATCH = 60000, 64
MS = (1, 10, 100, 1000)
ESTIMATORS = {"naive": "naive", "ours": "reparameterized"}


def make_step(estimator: str, num_draws: int, device: str, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS):
    """One training step of a Radial LeNet-300-100 (see the module docstring)."""
    torch.manual_seed(0)
    net = build_architecture("lenet300100", 784, 10)
    bnn = BayesianNetwork(net, stochastic="all", likelihood=CategoricalLikelihood(), output_dim=10)
    guide = build_guide(
        "radial", bnn, mc_kl_samples=num_draws, mc_kl_estimator=estimator, init_scale=1e-2, chunk_elements=chunk_elements
    ).to(device)
    net = net.to(device)
    priors = {
        s.name: pyro.distributions.Normal(torch.zeros(s.shape, device=device), torch.ones(s.shape, device=device)).to_event(len(s.shape))
        for s in bnn.sites
    }
    optimizer = torch.optim.Adam(guide.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, 784, generator=g).to(device)
    y = torch.randint(0, 10, (BATCH,), generator=g).to(device)

    def step():
        trace = poutine.trace(guide).get_trace()
        values = {name: trace.nodes[name]["value"] for name in priors}
        nll = F.cross_entropy(functional_call(net, values, (x,)), y) * N
        kl = sum(guide.site_kl(name, prior) for name, prior in priors.items())
        loss = nll + kl
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def measure_memory(estimator: str, num_draws: int, device: str, chunk_elements: int) -> dict:
    """Run in a fresh process: peak memory of building the model and taking two steps."""
    step = make_step(ESTIMATORS[estimator], num_draws, device, chunk_elements)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2**20
        step()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**20
        return {"peak_mib": peak, "increase_mib": peak - before}
    before = _rss_mib()
    step()
    step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"peak_mib": peak, "increase_mib": peak - before}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--chunk-elements", type=int, default=DEFAULT_CHUNK_ELEMENTS,
                        help="noise elements held at once by the estimators (memory bound vs kernel count)")
    parser.add_argument("--measure-memory", nargs=2, metavar=("ESTIMATOR", "M"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.measure_memory:
        estimator, num_draws = args.measure_memory
        print(json.dumps(measure_memory(estimator, int(num_draws), args.device, args.chunk_elements)))
        return
    memory = {}
    for estimator in ESTIMATORS:
        for m in MS:
            out = subprocess.run(
                [sys.executable, __file__, "--device", args.device, "--threads", str(args.threads),
                 "--chunk-elements", str(args.chunk_elements), "--measure-memory", estimator, str(m)],
                check=True, capture_output=True, text=True,
            )
            memory[(estimator, m)] = json.loads(out.stdout.strip().splitlines()[-1])
    steps = {(e, m): make_step(ESTIMATORS[e], m, args.device, args.chunk_elements) for e in ESTIMATORS for m in MS}
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for fn in steps.values():
        fn()
    times = {k: [] for k in steps}
    for _ in range(args.rounds):
        for key, fn in steps.items():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times[key].append(time.perf_counter() - start)
    unit = "CUDA max_memory_allocated" if args.device == "cuda" else "peak RSS"
    print(f"Radial LeNet-300-100 (784-300-100-10), batch {BATCH}, device {args.device}, torch threads {args.threads}, "
          f"chunk {args.chunk_elements} elements; "
          f"memory: {unit} in a fresh process per row; time: median of {args.rounds} interleaved rounds")
    print(f"  {'estimator':9s} {'M':>5s} {'peak MiB':>10s} {'step +MiB':>10s} {'step ms':>10s}")
    for (estimator, m), t in times.items():
        mem = memory[(estimator, m)]
        print(f"  {estimator:9s} {m:5d} {mem['peak_mib']:10.1f} {mem['increase_mib']:10.1f} {statistics.median(t) * 1e3:10.1f}")
    ours = lambda m: memory[("ours", m)]["peak_mib"]  # noqa: E731
    naive_growth = memory[("naive", 1000)]["increase_mib"] / max(memory[("naive", 1)]["increase_mib"], 1e-9)
    time_ratio = statistics.median(times[("ours", 1000)]) / statistics.median(times[("ours", 1)])
    naive_time_ratio = statistics.median(times[("naive", 1000)]) / statistics.median(times[("naive", 1)])
    print(f"naive step-memory growth M=1000/M=1: {naive_growth:.1f}x; naive time ratio {naive_time_ratio:.2f}")
    print(f"ours step-memory increase M=1000/M=1: {memory[('ours', 1000)]['increase_mib']:.1f} / {memory[('ours', 1)]['increase_mib']:.1f} MiB")
    print(f"radial_time_ratio_M1000 {time_ratio:.2f}")
    print(f"radial_mem_ratio_M1000 {ours(1000) / ours(1):.3f}")


if __name__ == "__main__":
    main()
