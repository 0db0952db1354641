"""Digits, LeNet-300-100, KFAC Laplace on every weight: how its test ECE compares with MAP's (issue 25).

Two measurements:

* ``sweep --seed S`` — the run's MAP and KFAC GGN (the ``laplace`` backend's own
  :func:`~inference.laplace.map_ggn.map_and_curvature`, the ``map`` run's budget), then, for prior precision
  scales δ = 10^0 … 10^7 (five a decade), the test NLL and ECE (15 bins) of four predictives of the Gaussian
  logits N(μ, J Σ(δ) Jᵀ): ``probit`` (MacKay 1992, the default), ``bridge`` (Hobbhahn et al. 2022), ``mc``
  (2 000 logit draws: the GLM predictive without the closed-form approximation) and ``pairwise`` (MacKay's
  binary probit on each logit difference, p_k ∝ 1 / Σ_j exp(−(μ_k − μ_j) / √(1 + π/8 Var(f_k − f_j))), as
  Lu, Ie & Sha 2020's mean-field form with the full covariance) — where the ECE goes as δ moves.
* ``bootstrap --laplace L0 L1 L2 --map M0 M1 M2`` — the paired bootstrap (1 000 resamples of the 450 test
  points per seed) of the mean over the seeds of ECE(KFAC Laplace) − ECE(MAP), from the stored test
  predictions of run folders, one per seed and method in the same seed order (``python -m zoo fit --data digits
  --model lenet300100 --stochastic all --backend laplace --option hessian=kfac --seed S --out L_S``, and
  ``--backend map``; or a ``paper-protocols`` folder's ``runs/digits-laplace_(all,_kfac)-S`` and ``runs/digits-map-S``).

    python benchmarks/laplace_digits_calibration.py sweep --seed 0
    python benchmarks/laplace_digits_calibration.py bootstrap --laplace L0 L1 L2 --map M0 M1 M2

The last line is ``ece_difference_mean D se S`` (bootstrap) or the MAP's NLL / ECE (sweep).
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import arviz as az
import numpy as np
import torch

from inference.evaluation.metrics import ece_from_probs
from inference.laplace.curvature import WeightLayout, jacobian_chunks, jacobian_path
from inference.laplace.evidence import prior_moments
from inference.laplace.laplace_posterior import _projected, bridge_log_alpha, probit_logits
from inference.laplace.map_ggn import covariance_root, map_and_curvature
from lab.run_model import build_model
from lab.run_spec import RunSpec, resolve_backend_options
from zoo.data import load_dataset

DELTAS = [10.0 ** (k / 5) for k in range(0, 36)]


def nll_and_ece(probs: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    probs = probs.double().clamp_min(1e-300)
    return float(-probs[torch.arange(len(labels)), labels].log().mean()), ece_from_probs(probs, labels)


def predictives(mean: torch.Tensor, cov: torch.Tensor, eps: torch.Tensor) -> dict:
    """Class probabilities ``[N, K]`` of each predictive for logits N(``mean`` [N, K], ``cov`` [N, K, K])."""
    var = cov.diagonal(dim1=-2, dim2=-1)
    chol = torch.linalg.cholesky(cov + 1e-9 * torch.eye(cov.shape[-1], dtype=cov.dtype))
    diff_var = var[:, :, None] + var[:, None, :] - 2 * cov
    pairwise = 1.0 / torch.exp(-(mean[:, :, None] - mean[:, None, :]) / torch.sqrt(1 + math.pi / 8 * diff_var)).sum(-1)
    return {
        "probit": torch.softmax(probit_logits(mean, var), -1),
        "bridge": torch.softmax(bridge_log_alpha(mean, cov), -1),
        "mc": torch.softmax(mean + torch.einsum("nij,snj->sni", chol, eps), -1).mean(0),
        "pairwise": pairwise / pairwise.sum(-1, keepdim=True),
    }


def sweep(seed: int) -> None:
    spec = RunSpec(data="digits", model="lenet300100", stochastic="all", backend="laplace", seed=seed,
                   backend_options={"hessian": "kfac"})
    data = load_dataset("digits", split=0, seed=seed)
    options = resolve_backend_options(spec, data)
    bnn = build_model(spec, data)
    layout = WeightLayout(bnn)
    _, p0, _ = prior_moments(bnn, layout)
    path = jacobian_path(layout, layout.flatten(bnn.initial_values()).detach(), data.x_train)
    w, _, _, eigenvalues, basis, _ = map_and_curvature(bnn, layout, data.x_train, data.y_train, "kfac", path, p0, "map",
                                                      options["map_steps"], 0.01, False, seed)
    unit = covariance_root("kfac", basis, torch.ones_like(eigenvalues), w.dtype)
    inv = (eigenvalues[:, None] + torch.tensor(DELTAS, dtype=eigenvalues.dtype)[None, :]).reciprocal().to(w.dtype)
    means, covs = [], []
    with torch.enable_grad():
        for _, f, jac in jacobian_chunks(layout, w.detach(), data.x_test):
            projected = _projected(unit, jac.detach())  # [n, K, P]
            means.append(f.detach().double())
            covs.append(torch.stack([(projected * inv[:, g]) @ projected.transpose(-1, -2) for g in range(len(DELTAS))]))
    mean, cov = torch.cat(means), torch.cat(covs, 1).detach().double()
    labels = data.y_test.long()
    eps = torch.randn(2000, *mean.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    print(f"digits seed {seed}, KFAC Laplace on {layout.dim} weights, MAP of {options['map_steps']} steps; "
          f"test NLL / ECE per δ:")
    for g, delta in enumerate(DELTAS):
        rows = predictives(mean, cov[g], eps)
        print(f"δ {delta:11.1f}  " + "  ".join(f"{k} {nll:.4f} / {ece:.4f}" for k, (nll, ece) in
                                              ((k, nll_and_ece(p, labels)) for k, p in rows.items())))
    print("MAP NLL %.4f ECE %.4f" % nll_and_ece(torch.softmax(mean, -1), labels))


def bootstrap(laplace_runs: list, map_runs: list, resamples: int = 1000) -> None:
    def test_probs(run: Path) -> tuple[torch.Tensor, torch.Tensor]:
        idata = az.from_netcdf(run / "posterior.nc")
        probs = idata.predictions["probs"].values
        return torch.as_tensor(probs.reshape(-1, *probs.shape[-2:]).mean(0)), torch.as_tensor(
            idata.observed_data["obs"].values).long()

    seeds = []
    for laplace_run, map_run in zip(laplace_runs, map_runs, strict=True):
        laplace, labels = test_probs(laplace_run)
        map_probs, map_labels = test_probs(map_run)
        if not torch.equal(labels, map_labels):
            raise SystemExit(f"{laplace_run} and {map_run} predict different test sets: give them in the same seed order")
        seeds.append((laplace, map_probs, labels))
        print(f"{laplace_run.name} vs {map_run.name}: ECE KFAC Laplace {ece_from_probs(laplace, labels):.4f}, "
              f"MAP {ece_from_probs(map_probs, labels):.4f}")
    rng = np.random.default_rng(0)
    point = np.mean([ece_from_probs(a, y) - ece_from_probs(b, y) for a, b, y in seeds])
    draws = []
    for _ in range(resamples):
        diffs = []
        for a, b, y in seeds:
            rows = torch.as_tensor(rng.integers(0, len(y), len(y)))
            diffs.append(ece_from_probs(a[rows], y[rows]) - ece_from_probs(b[rows], y[rows]))
        draws.append(np.mean(diffs))
    print(f"P(difference > 0) over the resamples {np.mean(np.array(draws) > 0):.2f}")
    print(f"ece_difference_mean {point:.4f} se {np.std(draws):.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("sweep").add_argument("--seed", type=int, default=0)
    boot = sub.add_parser("bootstrap")
    boot.add_argument("--laplace", type=Path, nargs="+", required=True, help="KFAC Laplace run folders, one per seed")
    boot.add_argument("--map", type=Path, nargs="+", required=True, help="MAP run folders, same seeds and order")
    args = parser.parse_args()
    if args.command == "sweep":
        sweep(args.seed)
    else:
        bootstrap(args.laplace, args.map)


if __name__ == "__main__":
    main()
