"""NumPyro NUTS vs our NUTS backend on two small Bayesian MLPs (issue 16).

Both samplers run the same model, data, Normal(0, 1) priors on all weights and biases,
Gaussian noise sd 0.1, 8 chains evaluated together (NumPyro: ``chain_method="vectorized"``;
ours: one batched, compiled pass per leapfrog step), 200 warm-up iterations and 200 draws
per chain, both in float32 and on one CPU thread (``torch.set_num_threads(1)``; XLA's CPU
client with ``--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``).

* tiny — the 1-10-1 tanh network of ``benchmarks/nuts_tiny_bnn.py`` (50 points of
  sin(3x) + 0.1ε); metric points x* = linspace(−1.5, 1.5, 7).
* energy — an 8-50-1 ReLU MLP on UCI energy (split 0 of Hernández-Lobato & Adams 2015, 691
  training rows, standardised); metric points: the first 7 test inputs.

Metric: ArviZ bulk ESS (rank-normalised, Vehtari et al. 2021) of the predictive mean f(x*)
at the metric points, mean and min over the points, per second of wall time of the whole
fit.  Wall time is split into start (ours: building the potential and the MAP
initialisation; NumPyro: nothing before its first call, which JIT-compiles), warm-up and
sampling (NumPyro's phases include their JIT compiles).  µs per vectorised gradient =
sampling seconds ÷ Σ over iterations of the largest leapfrog count among the chains (the
batched step runs until the last chain's tree is built).  Runs are interleaved (ours,
NumPyro, ours, ...) and each side is summarised by its median.

Needs the optional ``bench`` extra: ``pip install -e .[bench]`` (numpyro + CPU jax).

    python benchmarks/nuts_vs_numpyro.py                          # 2 repeats tiny, 1 energy
    python benchmarks/nuts_vs_numpyro.py --models tiny --repeats 3 --cached-grad

The last line is ``nuts_vs_numpyro_ess_per_s_ratio <ours ÷ NumPyro, tiny model>``; the line
before it gives the energy ratio.
"""
from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nuts_tiny_bnn import NOISE, SAMPLES, WARMUP, bulk_ess, data  # noqa: E402

from inference import fit  # noqa: E402
from zoo import BayesianNetwork, GaussianLikelihood, NormalPrior  # noqa: E402
from zoo.data.uci import load_uci  # noqa: E402

try:
    import jax  # noqa: E402
    import jax.numpy as jnp  # noqa: E402
    import numpyro  # noqa: E402
    import numpyro.distributions as ndist  # noqa: E402
    from numpyro.infer import MCMC as NMCMC, NUTS as NNUTS  # noqa: E402
except ImportError:
    sys.exit("numpyro/jax are missing: install the bench extra, `pip install -e .[bench]` (numpyro>=0.15, jax[cpu])")

ACTIVATIONS = {"tanh": (nn.Tanh, np.tanh, jnp.tanh), "relu": (nn.ReLU, lambda a: np.maximum(a, 0), jax.nn.relu)}


def problem(name):
    """``(x [N, D], y [N, 1], x* [7, D], hidden width, activation)`` float32 tensors."""
    if name == "tiny":
        x, y, x_test = data()
        return x, y, x_test, 10, "tanh"
    ds = load_uci("energy", split=0)
    return ds.x_train, ds.y_train[:, :1], ds.x_test[:7], 50, "relu"


def predictive_mean(w1, b1, w2, b2, x_test, act):
    """f(x*) ``[..., P]`` for stacked weights in torch layout (w1 ``[..., H, D]``, w2 ``[..., 1, H]``)."""
    hidden = ACTIVATIONS[act][1](x_test @ np.swapaxes(w1, -1, -2) + b1[..., None, :])
    return (hidden @ np.swapaxes(w2, -1, -2) + b2[..., None, :])[..., 0]


def numpyro_model(x, hidden, act, y=None):
    d = x.shape[1]
    w1 = numpyro.sample("w1", ndist.Normal(0.0, 1.0).expand([hidden, d]).to_event(2))
    b1 = numpyro.sample("b1", ndist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
    w2 = numpyro.sample("w2", ndist.Normal(0.0, 1.0).expand([1, hidden]).to_event(2))
    b2 = numpyro.sample("b2", ndist.Normal(0.0, 1.0).expand([1]).to_event(1))
    f = (ACTIVATIONS[act][2](x @ w1.T + b1) @ w2.T + b2)[:, 0]
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("obs", ndist.Normal(f, NOISE), obs=y)


def summarise(f, steps, start, warmup, sampling):
    """Common record: ``f`` ``[C, S, P]``, ``steps`` leapfrog counts ``[C, S]`` of the draws."""
    batched = steps.max(0).sum()
    return {
        "start": start, "warmup": warmup, "sampling": sampling, "seconds": start + warmup + sampling,
        "ess": bulk_ess(f), "leapfrog": float(steps.mean()), "us_per_grad": 1e6 * sampling / batched,
    }  # fmt: skip


def run_numpyro(x, y, x_test, hidden, act, chains, seed, rerun=False):
    mcmc = NMCMC(
        NNUTS(numpyro_model), num_warmup=WARMUP, num_samples=SAMPLES, num_chains=chains,
        chain_method="vectorized", progress_bar=False,
    )  # fmt: skip
    xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y[:, 0].numpy())
    t0 = time.perf_counter()
    mcmc.warmup(jax.random.PRNGKey(seed), xj, hidden, act, y=yj)
    jax.block_until_ready(mcmc.post_warmup_state)
    t1 = time.perf_counter()
    mcmc.run(mcmc.post_warmup_state.rng_key, xj, hidden, act, y=yj, extra_fields=("num_steps", "diverging"))
    s = mcmc.get_samples(group_by_chain=True)
    jax.block_until_ready(s)
    t2 = time.perf_counter()
    extra = mcmc.get_extra_fields(group_by_chain=True)
    s = {k: np.asarray(v) for k, v in s.items()}
    f = predictive_mean(s["w1"], s["b1"], s["w2"], s["b2"], x_test.numpy(), act)
    steps = np.asarray(extra["num_steps"])
    out = summarise(f, steps, 0.0, t1 - t0, t2 - t1)
    out["divergences"] = int(np.asarray(extra["diverging"]).sum())
    if rerun:  # the same sampling phase again with the JIT cache filled: µs per gradient without compiling
        t3 = time.perf_counter()
        mcmc.run(mcmc.post_warmup_state.rng_key, xj, hidden, act, y=yj, extra_fields=("num_steps", "diverging"))
        jax.block_until_ready(mcmc.get_samples())
        again = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["num_steps"])
        out["us_per_grad_cached"] = 1e6 * (time.perf_counter() - t3) / again.max(0).sum()
    return out


def run_ours(x, y, x_test, hidden, act, chains, seed):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(x.shape[1], hidden), ACTIVATIONS[act][0](), nn.Linear(hidden, 1))
    bnn = BayesianNetwork(net, "all", NormalPrior(1.0), GaussianLikelihood(noise_sd=NOISE), output_dim=1)
    t0 = time.perf_counter()
    post = fit(bnn, x, y, backend="nuts", seed=seed, progress=False, num_chains=chains, warmup_steps=WARMUP, num_samples=SAMPLES)
    seconds = time.perf_counter() - t0
    d = {k: v.numpy() for k, v in post.draws.items()}
    f = predictive_mean(d["0.weight"], d["0.bias"], d["2.weight"], d["2.bias"], x_test.numpy(), act)
    warm, samp = post.info["warmup_seconds"], post.info["sampling_seconds"]
    out = summarise(f, post.sample_stats["n_steps"].numpy(), seconds - warm - samp, warm, samp)
    out["divergences"] = int(post.sample_stats["diverging"].sum())
    return out


def line(side, r, o):
    return (
        f"  {side:7s} run {r}: {o['seconds']:6.1f} s (start {o['start']:.1f}, warm-up {o['warmup']:.1f}, "
        f"sampling {o['sampling']:.1f}); leapfrog/iter {o['leapfrog']:.0f}, {o['us_per_grad']:.0f} µs/vectorised grad; "
        f"bulk ESS mean {o['ess'].mean():.0f} min {o['ess'].min():.0f}; ESS/s {o['ess'].mean() / o['seconds']:.1f}; "
        f"divergences {o['divergences']}"
        + (f"; {o['us_per_grad_cached']:.0f} µs/grad with the JIT cache filled" if "us_per_grad_cached" in o else "")
    )


def compare(name, repeats, chains, cached_grad):
    x, y, x_test, hidden, act = problem(name)
    print(f"{name}: {x.shape[1]}-{hidden}-1 {act}, N={x.shape[0]}, {chains} chains, {WARMUP}+{SAMPLES}, {repeats} repeat(s) per side", flush=True)
    runs = {"ours": [], "numpyro": []}
    for r in range(repeats):
        runs["ours"].append(run_ours(x, y, x_test, hidden, act, chains, seed=r))
        print(line("ours", r, runs["ours"][-1]), flush=True)
        runs["numpyro"].append(run_numpyro(x, y, x_test, hidden, act, chains, seed=r, rerun=cached_grad))
        print(line("numpyro", r, runs["numpyro"][-1]), flush=True)
    rate = {}
    for side, rs in runs.items():
        med = {k: statistics.median(float(np.mean(o[k])) for o in rs) for k in ("seconds", "start", "warmup", "sampling", "leapfrog", "us_per_grad")}
        ess_mean = statistics.median(float(o["ess"].mean()) for o in rs)
        ess_min = statistics.median(float(o["ess"].min()) for o in rs)
        rate[side] = ess_mean / med["seconds"]
        print(
            f"  {side:7s} median: {med['seconds']:.1f} s (start {med['start']:.1f} / warm-up {med['warmup']:.1f} / "
            f"sampling {med['sampling']:.1f}), leapfrog/iter {med['leapfrog']:.0f}, {med['us_per_grad']:.0f} µs/grad, "
            f"bulk ESS mean {ess_mean:.0f} min {ess_min:.0f}, ESS/s mean {rate[side]:.1f} min {ess_min / med['seconds']:.1f}",
            flush=True,
        )
    return rate["ours"] / rate["numpyro"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "energy"], choices=["tiny", "energy"])
    parser.add_argument("--repeats", type=int, default=2, help="interleaved runs per side on the tiny model")
    parser.add_argument("--energy-repeats", type=int, default=1, help="interleaved runs per side on energy")
    parser.add_argument("--chains", type=int, default=8)
    parser.add_argument(
        "--cached-grad", action="store_true",
        help="rerun NumPyro's sampling phase once more (untimed in the totals) to time its µs/grad without the JIT compile",
    )  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__} (1 thread), jax {jax.__version__} / numpyro {numpyro.__version__} "
          f"(XLA_FLAGS={os.environ['XLA_FLAGS']!r}), load average {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    ratios = {m: compare(m, args.repeats if m == "tiny" else args.energy_repeats, args.chains, args.cached_grad) for m in args.models}
    if "energy" in ratios:
        print(f"nuts_vs_numpyro_ess_per_s_ratio_energy {ratios['energy']:.2f}")
    if "tiny" in ratios:
        print(f"nuts_vs_numpyro_ess_per_s_ratio {ratios['tiny']:.2f}")


if __name__ == "__main__":
    main()
