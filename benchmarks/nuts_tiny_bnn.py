"""Stock Pyro NUTS vs our NUTS backend on a tiny Bayesian neural network.

Model (issue 3): a 1-10-1 tanh network, 50 points x = linspace(−1, 1), y = sin(3x) + 0.1ε,
Normal(0, 1) priors on all weights and biases, Gaussian noise sd 0.1; 200 warm-up
iterations and 200 draws per chain.  Metric: bulk ESS (ArviZ, rank-normalised) of the
predictive mean f(x*) at the 7 test points x* = linspace(−1.5, 1.5, 7), averaged over the
points (the minimum is printed too), per second of wall time of the whole fit (our MAP
initialisation and torch.compile included).

* stock — ``pyro.infer.NUTS`` on a ``PyroModule`` with ``PyroSample`` priors, one chain
  (Pyro's default; its multi-chain mode forks processes).  At ~1–2 s per iteration a full
  run takes 8–15 min here, so by default it runs ``--stock-warmup`` + ``--stock-samples``
  iterations and the full run is *extrapolated*: time = 200·(mean warm-up iteration time)
  + 200·(mean sampling iteration time) — conservative, since the short warm-up has a larger
  share of the cheap early iterations — and ESS = 200 · (ESS per draw of its draws).
  ``--stock-full`` runs the full 200 + 200 instead.
* ours — ``inference.fit(bnn, x, y, backend="nuts")`` with ``--chains`` chains evaluated in
  one batched, compiled pass per leapfrog step.

Runs are interleaved (ours, stock, ours, ...) and ours is summarised by the median over
``--repeats`` runs.  The last line is ``nuts_ess_per_s_ratio <ours ÷ stock>``.

    python benchmarks/nuts_tiny_bnn.py                 # ~8-10 min on 2 busy cores
    python benchmarks/nuts_tiny_bnn.py --repeats 1 --stock-warmup 20 --stock-samples 40  # quicker, noisier
    python benchmarks/nuts_tiny_bnn.py --skip-stock --repeats 3   # only ours (e.g. before/after a change)
"""
from __future__ import annotations

import argparse
import statistics
import time

import arviz as az
import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC, NUTS
from pyro.nn import PyroModule, PyroSample
from torch import nn

from inference import fit
from zoo import BayesianNetwork, GaussianLikelihood, NormalPrior

WARMUP, SAMPLES, NOISE = 200, 200, 0.1


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.linspace(-1, 1, 50).unsqueeze(-1)
    y = torch.sin(3 * x) + NOISE * torch.randn(x.shape, generator=g)
    return x, y, torch.linspace(-1.5, 1.5, 7).unsqueeze(-1)


class StockBNN(PyroModule):
    """The tiny BNN the way Pyro's tutorials write it."""

    def __init__(self):
        super().__init__()
        self.fc1 = PyroModule[nn.Linear](1, 10)
        self.fc1.weight = PyroSample(dist.Normal(0.0, 1.0).expand([10, 1]).to_event(2))
        self.fc1.bias = PyroSample(dist.Normal(0.0, 1.0).expand([10]).to_event(1))
        self.fc2 = PyroModule[nn.Linear](10, 1)
        self.fc2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, 10]).to_event(2))
        self.fc2.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

    def forward(self, x, y=None):
        f = self.fc2(torch.tanh(self.fc1(x))).squeeze(-1)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(f, NOISE), obs=y)
        return f


def predictive_mean(w1, b1, w2, b2, x_test):
    """f(x*) ``[S, 7]`` for stacked weights of the 1-10-1 network."""
    hidden = torch.tanh(x_test @ w1.transpose(-1, -2) + b1.unsqueeze(-2))
    return (hidden @ w2.transpose(-1, -2) + b2.unsqueeze(-2)).squeeze(-1)


def bulk_ess(f: np.ndarray) -> np.ndarray:
    """Bulk ESS per test point of draws ``[chains, draws, points]``."""
    return az.ess(az.convert_to_dataset({"f": f}))["f"].values


def run_stock(x, y, x_test, warmup, samples, seed):
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    stamps = []
    mcmc = MCMC(
        NUTS(StockBNN()),
        num_samples=samples,
        warmup_steps=warmup,
        disable_progbar=True,
        hook_fn=lambda *args: stamps.append(time.perf_counter()),
    )
    start = time.perf_counter()
    mcmc.run(x, y.squeeze(-1))
    seconds = time.perf_counter() - start
    s = mcmc.get_samples()
    f = predictive_mean(s["fc1.weight"], s["fc1.bias"], s["fc2.weight"], s["fc2.bias"], x_test)
    times = np.diff([start] + stamps)
    ess = bulk_ess(f.numpy()[None])
    t_warm, t_samp = times[:warmup].mean(), times[warmup:].mean()
    return {
        "seconds": seconds,
        "sec_per_warmup_it": t_warm,
        "sec_per_sample_it": t_samp,
        "ess": ess,
        "projected_seconds": WARMUP * t_warm + SAMPLES * t_samp,
        "projected_ess": ess / samples * SAMPLES,
    }


def run_ours(x, y, x_test, chains, seed):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(1, 10), nn.Tanh(), nn.Linear(10, 1))
    bnn = BayesianNetwork(net, "all", NormalPrior(1.0), GaussianLikelihood(noise_sd=NOISE), output_dim=1)
    start = time.perf_counter()
    post = fit(bnn, x, y, backend="nuts", seed=seed, progress=False, num_chains=chains, warmup_steps=WARMUP, num_samples=SAMPLES,
               time_budget=None)
    seconds = time.perf_counter() - start
    d = post.draws
    f = predictive_mean(d["0.weight"], d["0.bias"], d["2.weight"], d["2.bias"], x_test)
    stats = post.sample_stats
    return {
        "seconds": seconds,
        "ess": bulk_ess(f.numpy()),
        "divergences": int(stats["diverging"].sum()),
        "mean_tree_depth": float(stats["tree_depth"].float().mean()),
        "mean_leapfrog_steps": float(stats["n_steps"].float().mean()),
        "warmup_seconds": post.info["warmup_seconds"],
        "sampling_seconds": post.info["sampling_seconds"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2, help="runs of ours (stock runs once, in between)")
    parser.add_argument("--stock-warmup", type=int, default=50)
    parser.add_argument("--stock-samples", type=int, default=100)
    parser.add_argument("--stock-full", action="store_true", help="run stock for the full 200 + 200")
    parser.add_argument("--skip-stock", action="store_true", help="time only ours (no stock run, no ratio)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # same budget for both; the machine has 2 shared cores
    x, y, x_test = data()
    stock_w, stock_s = (WARMUP, SAMPLES) if args.stock_full else (args.stock_warmup, args.stock_samples)
    ours, stock = [], None
    for r in range(args.repeats):
        ours.append(run_ours(x, y, x_test, args.chains, seed=r))
        o = ours[-1]
        print(
            f"ours  run {r}: {o['seconds']:7.1f} s (warm-up {o['warmup_seconds']:.1f}, sampling {o['sampling_seconds']:.1f}), "
            f"{args.chains} chains x {SAMPLES} draws, bulk ESS mean {o['ess'].mean():.0f} min {o['ess'].min():.0f}, "
            f"tree depth {o['mean_tree_depth']:.2f}, leapfrog/iter {o['mean_leapfrog_steps']:.0f}, divergences {o['divergences']}",
            flush=True,
        )
        if stock is None and not args.skip_stock:
            stock = run_stock(x, y, x_test, stock_w, stock_s, seed=0)
            print(
                f"stock run: {stock['seconds']:7.1f} s for {stock_w} warm-up + {stock_s} draws (1 chain); "
                f"{stock['sec_per_warmup_it']:.2f} s/warm-up it, {stock['sec_per_sample_it']:.2f} s/sampling it; "
                f"bulk ESS mean {stock['ess'].mean():.0f} min {stock['ess'].min():.0f}",
                flush=True,
            )
    ours_seconds = statistics.median(o["seconds"] for o in ours)
    ours_ess_mean = statistics.median(float(o["ess"].mean()) for o in ours)
    ours_ess_min = statistics.median(float(o["ess"].min()) for o in ours)
    ours_sampling = statistics.median(o["sampling_seconds"] for o in ours)
    summary = f"ours ({args.chains} chains, median of {len(ours)}): {ours_seconds:.0f} s, bulk ESS mean {ours_ess_mean:.0f} min {ours_ess_min:.0f}"
    if args.skip_stock:
        print(f"\n{summary}; sampling phase {ours_sampling:.1f} s")
        return
    if args.stock_full:
        s_seconds, s_ess = stock["seconds"], stock["ess"]
        note = "measured"
    else:
        s_seconds, s_ess = stock["projected_seconds"], stock["projected_ess"]
        note = (
            f"EXTRAPOLATED to {WARMUP}+{SAMPLES} from a {stock_w}+{stock_s} run "
            f"(per-iteration cost x iterations; ESS per draw x {SAMPLES} draws)"
        )
    print(f"\nstock Pyro NUTS ({note}): {s_seconds:.0f} s, bulk ESS mean {s_ess.mean():.0f} min {s_ess.min():.0f}")
    print(summary)
    stock_rate, ours_rate = s_ess.mean() / s_seconds, ours_ess_mean / ours_seconds
    print(f"ESS/s (mean over the 7 points): stock {stock_rate:.3f}, ours {ours_rate:.2f}")
    print(f"ESS/s (min over the 7 points):  stock {s_ess.min() / s_seconds:.3f}, ours {ours_ess_min / ours_seconds:.2f}")
    print(f"nuts_ess_per_s_ratio {ours_rate / stock_rate:.1f}")


if __name__ == "__main__":
    main()
