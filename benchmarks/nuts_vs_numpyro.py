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
sampling (both sides' phases include their compiles).  µs per vectorised gradient =
sampling seconds ÷ Σ over iterations of the largest leapfrog count among the chains (the
batched step runs until the last chain's tree is built).

Two measurements per model (issue 26):

* cold — each fit in a fresh process (``--worker``); NumPyro with JAX's default (no persistent
  compilation cache), ours in two states of torch's inductor disk cache (``TORCHINDUCTOR_CACHE_DIR``):
  *kept* — a private folder filled by one untimed fresh process of ours first, the state of a user's
  machine after its first fit of the model, since torch keeps that cache between processes by
  default (issue 26: "compiled artefacts cached across fits and processes where torch allows") —
  and *empty* — a new folder per process, the first fit on a machine.  ``--cold-repeats``
  interleaved triples (ours kept, ours empty, NumPyro, ...); each ratio is of the medians.
  ``--cache kept`` / ``empty`` runs one state only.  Imports are not timed (each side imports its
  own library before the fit starts).
* warm — ``--repeats`` (tiny) / ``--energy-repeats`` (energy) interleaved fits per side in this
  process after one untimed fit per side (compiles done); the ratio is of the medians.

Needs the optional ``bench`` extra: ``pip install -e .[bench]`` (numpyro + CPU jax).

    python benchmarks/nuts_vs_numpyro.py                          # cold 1 triple each, warm 2 tiny
    python benchmarks/nuts_vs_numpyro.py --models tiny --cold-repeats 3 --repeats 0

The last lines are ``nuts_vs_numpyro_ess_per_s_ratio_energy`` / ``nuts_vs_numpyro_ess_per_s_ratio``
(warm, when run), ``nuts_vs_numpyro_cold_ratio_empty_cache_energy`` / ``nuts_vs_numpyro_cold_ratio_empty_cache``
(fresh processes, empty cache) and then ``nuts_vs_numpyro_cold_ratio_energy R`` and, last,
``nuts_vs_numpyro_cold_ratio R`` (fresh processes, kept cache; ours ÷ NumPyro).
"""
from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
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


def run_numpyro(x, y, x_test, hidden, act, chains, seed):
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
    return out


def run_ours(x, y, x_test, hidden, act, chains, seed):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(x.shape[1], hidden), ACTIVATIONS[act][0](), nn.Linear(hidden, 1))
    bnn = BayesianNetwork(net, "all", NormalPrior(1.0), GaussianLikelihood(noise_sd=NOISE), output_dim=1)
    t0 = time.perf_counter()
    post = fit(bnn, x, y, backend="nuts", seed=seed, progress=False, num_chains=chains, warmup_steps=WARMUP, num_samples=SAMPLES,
               time_budget=None)
    seconds = time.perf_counter() - t0
    d = {k: v.numpy() for k, v in post.draws.items()}
    f = predictive_mean(d["0.weight"], d["0.bias"], d["2.weight"], d["2.bias"], x_test.numpy(), act)
    warm, samp = post.info["warmup_seconds"], post.info["sampling_seconds"]
    out = summarise(f, post.sample_stats["n_steps"].numpy(), seconds - warm - samp, warm, samp)
    out["divergences"] = int(post.sample_stats["diverging"].sum())
    out.update({k: post.info.get(k) for k in ("map_steps", "map_seconds", "compiled_from", "compile_seconds")})
    return out


def line(side, r, o):
    ours = ""
    if "map_steps" in o:
        compiled = "never compiled" if o["compiled_from"] is None else (
            f"compiled from iteration {o['compiled_from']}, first compiled call {o['compile_seconds']:.1f} s")
        ours = f"; MAP {o['map_steps']} steps {o['map_seconds']:.1f} s; {compiled}"
    return (
        f"  {side:7s} run {r}: {o['seconds']:6.1f} s (start {o['start']:.1f}, warm-up {o['warmup']:.1f}, "
        f"sampling {o['sampling']:.1f}); leapfrog/iter {o['leapfrog']:.0f}, {o['us_per_grad']:.0f} µs/vectorised grad; "
        f"bulk ESS mean {o['ess_mean']:.0f} min {o['ess_min']:.0f}; ESS/s {o['ess_mean'] / o['seconds']:.1f}; "
        f"divergences {o['divergences']}; {o['cpu']:.1f} CPU s{ours}"
    )


def flat(o):
    """A run's record with plain floats (JSON): ESS mean / min over the points instead of the array."""
    out = {k: (float(v) if isinstance(v, (float, np.floating)) else v) for k, v in o.items() if k != "ess"}
    return {**out, "ess_mean": float(o["ess"].mean()), "ess_min": float(o["ess"].min())}


def cpu_seconds():
    """CPU seconds of this process (all threads) and its finished children (the C++ compiler)."""
    return time.process_time() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime + resource.getrusage(
        resource.RUSAGE_CHILDREN).ru_stime


def fit_once(side, name, chains, seed):
    """One fit's record, with ``cpu``: its CPU seconds, which other jobs on the machine do not inflate."""
    x, y, x_test, hidden, act = problem(name)
    run = run_ours if side == "ours" else run_numpyro
    started = cpu_seconds()
    out = flat(run(x, y, x_test, hidden, act, chains, seed=seed))
    return {**out, "cpu": cpu_seconds() - started}


def cold(name, side, chains, seed, cache):
    """One fit in a fresh process; ours with inductor's disk cache in folder ``cache`` (NumPyro: ``None``)."""
    env = dict(os.environ)
    if cache is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache
    cmd = [sys.executable, __file__, "--worker", side, name, str(chains), str(seed)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"the {side} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cold_runs(name, chains, repeats, states):
    """``{side: [records]}`` of ``repeats`` interleaved fresh processes per side: ``ours kept`` (a private
    inductor cache filled first by one untimed process), ``ours empty`` (a new cache each) as ``states``
    asks, and ``numpyro``."""
    sides = [f"ours {state}" for state in states] + ["numpyro"]
    runs = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as kept:
        if "kept" in states:
            cold(name, "ours", chains, 1000, kept)  # untimed: fills the kept cache, as a user's first fit does
        for r in range(repeats):
            for side in sides:
                if side == "ours empty":
                    with tempfile.TemporaryDirectory() as empty:
                        runs[side].append(cold(name, "ours", chains, r, empty))
                else:
                    runs[side].append(cold(name, side.split()[0], chains, r, kept if side == "ours kept" else None))
                print(line(side, r, runs[side][-1]), flush=True)
    return runs


def summary(side, rs, label):
    """Print the medians of runs ``rs``; return the median ESS/s (mean over the points)."""
    med = {k: statistics.median(o[k] for o in rs) for k in ("seconds", "start", "warmup", "sampling", "leapfrog", "us_per_grad", "cpu")}
    ess_mean = statistics.median(o["ess_mean"] for o in rs)
    ess_min = statistics.median(o["ess_min"] for o in rs)
    print(
        f"  {side:7s} {label} median of {len(rs)}: {med['seconds']:.1f} s (start {med['start']:.1f} / warm-up "
        f"{med['warmup']:.1f} / sampling {med['sampling']:.1f}), leapfrog/iter {med['leapfrog']:.0f}, "
        f"{med['us_per_grad']:.0f} µs/grad, bulk ESS mean {ess_mean:.0f} min {ess_min:.0f}, "
        f"ESS/s mean {ess_mean / med['seconds']:.1f} min {ess_min / med['seconds']:.1f}; {med['cpu']:.1f} CPU s, "
        f"ESS per CPU s {ess_mean / med['cpu']:.1f}",
        flush=True,
    )
    return ess_mean / med["seconds"]


def compare(name, cold_repeats, repeats, chains, states):
    """``{"kept"/"empty": cold ratio, "warm": warm ratio}`` of ESS/s, ours ÷ NumPyro (those that ran)."""
    x, y, _, hidden, act = problem(name)
    print(f"{name}: {x.shape[1]}-{hidden}-1 {act}, N={x.shape[0]}, {chains} chains, {WARMUP}+{SAMPLES}", flush=True)
    ratios = {}
    if cold_repeats:
        print(f" cold: each fit in a fresh process (ours with the inductor cache {' / '.join(states)}), "
              f"{cold_repeats} interleaved round(s)", flush=True)
        runs = cold_runs(name, chains, cold_repeats, states)
        numpyro = summary("numpyro", runs["numpyro"], "cold")
        for state in states:
            ratios[state] = summary(f"ours {state}", runs[f"ours {state}"], "cold") / numpyro
    if repeats:
        print(f" warm: {repeats} interleaved fit(s) per side in this process, after one untimed fit each", flush=True)
        for side in ("ours", "numpyro"):
            fit_once(side, name, chains, seed=100)  # compiles (and the MAP start's first call) out of the way
        runs = {"ours": [], "numpyro": []}
        for r in range(repeats):
            for side in runs:
                runs[side].append(fit_once(side, name, chains, seed=r))
                print(line(side, r, runs[side][-1]), flush=True)
        ratios["warm"] = summary("ours", runs["ours"], "warm") / summary("numpyro", runs["numpyro"], "warm")
    return ratios


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "energy"], choices=["tiny", "energy"])
    parser.add_argument("--cold-repeats", type=int, default=1, help="interleaved fresh-process pairs per model")
    parser.add_argument("--repeats", type=int, default=2, help="warm interleaved runs per side on the tiny model (0: none)")
    parser.add_argument("--energy-repeats", type=int, default=0, help="warm interleaved runs per side on energy (0: none)")
    parser.add_argument("--chains", type=int, default=8)
    parser.add_argument("--cache", choices=["both", "kept", "empty"], default="both",
                        help="the inductor disk cache of our cold processes: kept (filled by an untimed first process), "
                             "empty (a new folder each), or both")
    parser.add_argument("--worker", nargs=4, metavar=("SIDE", "MODEL", "CHAINS", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.worker:
        side, name, chains, seed = args.worker
        print(json.dumps(fit_once(side, name, int(chains), int(seed))), flush=True)
        return
    print(f"torch {torch.__version__} (1 thread), jax {jax.__version__} / numpyro {numpyro.__version__} "
          f"(XLA_FLAGS={os.environ['XLA_FLAGS']!r}), load average {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    states = ["kept", "empty"] if args.cache == "both" else [args.cache]
    ratios = {m: compare(m, args.cold_repeats, args.repeats if m == "tiny" else args.energy_repeats, args.chains,
                         states) for m in args.models}  # fmt: skip
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    for kind, stem in (("warm", "ess_per_s_ratio"), ("empty", "cold_ratio_empty_cache"), ("kept", "cold_ratio")):
        for model, key in (("energy", f"nuts_vs_numpyro_{stem}_energy"), ("tiny", f"nuts_vs_numpyro_{stem}")):
            if kind in ratios.get(model, {}):
                print(f"{key} {ratios[model][kind]:.2f}")


if __name__ == "__main__":
    main()
