"""Bitwise fingerprints of predictions for a fixed set of configurations (a refactoring check).

    python benchmarks/prediction_hashes.py > before.txt    # on the old code
    python benchmarks/prediction_hashes.py --compare before.txt   # on the new code

Every registered backend is fitted on a tiny regression (24 points of a sine, a 1-4-1 MLP; the smallest
settings that run it end to end) with the last layer and with all weights stochastic; a classification
network on scikit-learn's digits with two backends; the stacked multi-fit engine; one CLI run per task
through ``lab.runs.execution.execute``.  For each, the SHA-256 of the bytes of the predictive draws
(``Prediction.f``), of the pointwise log-likelihood that ``to_arviz`` exports, and of the prediction
after a save/load round trip.  One line per configuration, ``name digest``; the last line is
``prediction_hashes_equal <k>/<n>`` with ``--compare`` (``k`` configurations identical), else the
digest of all lines.  The hashes are of one machine's floating-point arithmetic: compare runs made on
the same machine with the same torch.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

from inference import BACKENDS, fit, load_posterior
from zoo import BayesianNetwork
from zoo.architectures import MLP
from zoo.likelihoods import make_likelihood


def _tiny_settings() -> dict:
    """The smallest settings that run each backend end to end: ``TINY`` of
    tests/inference/backends/test_backends_x_likelihoods.py (one list for the tests and this check)."""
    path = Path(__file__).resolve().parent.parent / "tests" / "inference" / "backends" / "test_backends_x_likelihoods.py"
    spec = importlib.util.spec_from_file_location("backends_x_likelihoods", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TINY


TINY = _tiny_settings()

#: extra configurations: (name, backend, stochastic, likelihood, options)
EXTRA = [
    ("laplace-kfac-glm", "laplace", "all", "gaussian", dict(map_steps=20, num_samples=6, hessian="kfac",
                                                             predictive="glm")),
    ("laplace-diag", "laplace", "last", "gaussian", dict(map_steps=20, num_samples=6, hessian="diag")),
    ("svi-heteroscedastic", "svi", "all", "heteroscedastic", dict(epochs=5, batch_size=8)),
    ("map-studentt", "map", "last", "studentt", dict(epochs=5, batch_size=8)),
    ("nuts-dense", "nuts", "last", "gaussian", dict(num_chains=1, warmup_steps=6, num_samples=6, map_steps=20,
                                                    max_tree_depth=3, compile=False, dense_mass=True)),
]


def digest(*tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(np.ascontiguousarray(torch.as_tensor(t).detach().cpu().numpy()).tobytes())
    return h.hexdigest()[:16]


def regression_problem(backend: str, stochastic: str, likelihood: str):
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 24).unsqueeze(1)
    y = 3.0 + 2.0 * torch.sin(3 * x) + 0.3 * torch.randn(24, 1)
    lik = make_likelihood(likelihood)
    net = MLP(1, lik.heads, hidden=(4,), dropout=0.1 if backend == "mc-dropout" else 0.0)
    bnn = BayesianNetwork(net, stochastic, likelihood=lik, example_input=x,
                          target_loc=y.mean(0), target_scale=y.std(0))
    return bnn, x, y, (y - bnn.target_loc) / bnn.target_scale


def fingerprint(posterior, x, y) -> str:
    prediction = posterior.predict(x, y=y, seed=0)
    idata = posterior.to_arviz(x, y, seed=0)
    with tempfile.TemporaryDirectory() as folder:
        posterior.save(f"{folder}/posterior")
        reloaded = load_posterior(f"{folder}/posterior").predict(x, y=y, seed=0)
    return digest(prediction.f, idata.log_likelihood["obs"].values, reloaded.f)


def configurations():
    for backend in BACKENDS:
        if backend not in TINY:
            continue
        for stochastic in ("last", "all"):
            yield f"{backend}-{stochastic}", backend, stochastic, "gaussian", TINY[backend]
    yield from EXTRA


def run_fits():
    for name, backend, stochastic, likelihood, options in configurations():
        bnn, x, y, y_std = regression_problem(backend, stochastic, likelihood)
        posterior = fit(bnn, x, y_std, backend=backend, seed=0, progress=False, **options)
        yield name, fingerprint(posterior, x, y)
    yield "digits", digits_fits()
    yield "multifit", multifit()
    for task, spec_options in (("regression", dict(data="uci:energy", model="mlp", stochastic="last", backend="map",
                                                   epochs=3)),
                               ("classification", dict(data="digits", model="mlp", stochastic="last",
                                                       backend="laplace", backend_options={"map_steps": 50}))):
        yield f"cli-{task}", cli_run(spec_options)


def digits_fits() -> str:
    from zoo.data import load_dataset
    data = load_dataset("digits", seed=0)
    parts = []
    for backend, options in (("map", dict(epochs=2, batch_size=64)), ("laplace", dict(map_steps=20,
                                                                                        num_samples=4))):
        torch.manual_seed(0)
        lik = make_likelihood("categorical")
        net = MLP(data.input_dim, data.output_dim, hidden=(8,))
        bnn = BayesianNetwork(net, "last", likelihood=lik, example_input=data.x_train)
        posterior = fit(bnn, data.x_train, data.y_train, backend=backend, seed=0, progress=False, **options)
        parts.append(posterior.predict(data.x_test[:50], seed=0).f)
    return digest(*parts)


def multifit() -> str:
    from inference.fitting import fit_many
    bnns, xs, ys = [], [], []
    for seed in range(3):
        bnn, x, _, y_std = regression_problem("map", "all", "gaussian")
        bnns.append(bnn), xs.append(x), ys.append(y_std + 0.01 * seed)
    parts = []
    for backend, options in (("map", dict(epochs=5, batch_size=8)), ("svi", dict(epochs=5, batch_size=8)),
                             ("ensemble", dict(epochs=5, batch_size=8, num_members=2))):
        posteriors = fit_many(bnns, xs, ys, backend=backend, seeds=[0, 1, 2], progress=False, **options)
        parts += [p.predict(xs[0], seed=0).f for p in posteriors]
    return digest(*parts)


def cli_run(spec_options: dict) -> str:
    from lab.runs.spec import RunSpec
    from lab.runs.execution import execute
    with tempfile.TemporaryDirectory() as folder:
        result = execute(RunSpec(seed=0, split=0, **spec_options), f"{folder}/run", progress=False)
        posterior = load_posterior(f"{folder}/run/posterior")
        return digest(*(torch.as_tensor(v) for k, v in sorted(result.metrics.items())
                        if isinstance(v, float) and "second" not in k and "time" not in k), posterior.sample_params(seed=0)[next(iter(
                            posterior.sample_params(seed=0)))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", help="a file of an earlier run's output")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    lines = []
    for name, value in run_fits():
        lines.append(f"{name} {value}")
        print(lines[-1], flush=True)
    if args.compare:
        before = dict(line.split() for line in open(args.compare) if len(line.split()) == 2
                      and not line.startswith("prediction_hashes"))
        now = dict(line.split() for line in lines)
        differ = [k for k in before if now.get(k) != before[k]]
        for k in differ:
            print(f"differs: {k} {before[k]} -> {now.get(k)}", file=sys.stderr)
        print(f"prediction_hashes_equal {len(before) - len(differ)}/{len(before)}")
    else:
        print(f"prediction_hashes_digest {hashlib.sha256(chr(10).join(lines).encode()).hexdigest()[:16]}")


if __name__ == "__main__":
    main()
