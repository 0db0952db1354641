"""Digits, LeNet-300-100, KFAC Laplace on every weight: how its test ECE compares with MAP's (issue 25).

Four measurements:

* ``sweep --seed S`` — the run's MAP and KFAC GGN (the ``laplace`` backend's own
  :func:`~inference.laplace.map_ggn.map_and_curvature`, the ``map`` run's budget), then, for prior precision
  scales δ = 10^0 … 10^7 (five a decade), the test NLL and ECE (15 bins) of four predictives of the Gaussian
  logits N(μ, J Σ(δ) Jᵀ): ``probit`` (MacKay 1992, the default), ``bridge`` (Hobbhahn et al. 2022), ``mc``
  (2 000 logit draws: the GLM predictive without the closed-form approximation) and ``pairwise`` (MacKay's
  binary probit on each logit difference, p_k ∝ 1 / Σ_j exp(−(μ_k − μ_j) / √(1 + π/8 Var(f_k − f_j))), as
  Lu, Ie & Sha 2020's mean-field form with the full covariance) — where the ECE goes as δ moves.
* ``bootstrap --laplace L0 L1 L2 --map M0 M1 M2`` — the paired bootstrap (1 000 resamples of the 450 test
  points per seed) of the mean over the seeds of ECE(KFAC Laplace) − ECE(MAP), and of the NLL difference,
  from the stored test predictions of run folders, one per seed and method in the same seed order
  (``python -m zoo fit --data digits --model lenet300100 --stochastic all --backend laplace --option hessian=kfac
  --seed S --out L_S``, and ``--backend map``; or a ``paper-protocols`` folder's
  ``runs/digits-laplace_(all,_kfac)-S`` and ``runs/digits-map-S``), with each run's mean confidence minus accuracy.
* ``folds --seed S [--folds 5]`` — δ by the backend's one held-out split against K-fold cross-validation
  (``validation_folds=K``: every training row held out once, a MAP per fold, the folds' NLL pooled), each then on
  the MAP of all rows, test NLL / ECE, on one torch thread as ``python -m zoo fit`` runs (so the MAPs are the runs').
* ``layerwise --seed S`` — one prior precision per layer instead of one for all: the backend's validation search
  (the same held-out rows, the held-out MAP for the refit's epochs, the probit's validation NLL) over every
  combination of δ_l ∈ 10^0 … 10^7 for the three layers, against the one-δ search on the same grid; then both on
  the MAP of all rows, test NLL / ECE.  KFAC's covariance is block-diagonal over layers, so the logit variance is
  Σ_l diag(J_l Σ_l(δ_l) J_lᵀ) and every combination costs one sum.

    python benchmarks/laplace_digits_calibration.py sweep --seed 0
    python benchmarks/laplace_digits_calibration.py bootstrap --laplace L0 L1 L2 --map M0 M1 M2
    python benchmarks/laplace_digits_calibration.py layerwise --seed 0
    python benchmarks/laplace_digits_calibration.py folds --seed 0 --folds 5

The last line is ``ece_difference_mean D se S`` (bootstrap), the MAP's NLL / ECE (sweep) or
``layerwise_test_ece map M one_delta O per_layer L`` (layerwise) or ``folds_test seed S map NLL ECE one_split δ NLL
ECE kfold δ NLL ECE`` (folds).
"""
from __future__ import annotations

import argparse
import itertools
import math
from pathlib import Path

import arviz as az
import numpy as np
import torch

from inference.backends.laplace import LaplaceConfig
from inference.evaluation.metrics import ece_from_probs
from inference.laplace.curvature import WeightLayout, jacobian_chunks, jacobian_path
from inference.laplace.evidence import held_out_folds, held_out_steps, prior_moments, validation_search
from inference.laplace.laplace_posterior import _projected, bridge_log_alpha, probit_logits
from inference.laplace.map_ggn import covariance_root, map_and_curvature
from lab.runs.model import build_model
from lab.runs.spec import RunSpec, resolve_backend_options
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


def digits_run(seed: int) -> tuple:
    """``(spec, data, map_steps)`` of ``python -m zoo fit --data digits --model lenet300100 --stochastic all
    --backend laplace --option hessian=kfac --seed S``: the split drawn from the seed, the ``map`` run's budget."""
    spec = RunSpec(data="digits", model="lenet300100", stochastic="all", backend="laplace", seed=seed,
                   backend_options={"hessian": "kfac"})
    data = load_dataset("digits", split=0, seed=seed)
    return spec, data, resolve_backend_options(spec, data)["map_steps"]


def kfac_model(spec, data, x: torch.Tensor) -> tuple:
    """``(bnn, layout, P₀ [P], Jacobian path)`` of a fresh model of the run (its seeded initial weights), for
    :func:`~inference.laplace.map_ggn.map_and_curvature` on rows ``x``."""
    bnn = build_model(spec, data)
    layout = WeightLayout(bnn)
    _, p0, _ = prior_moments(bnn, layout)
    return bnn, layout, p0, jacobian_path(layout, layout.flatten(bnn.initial_values()).detach(), x)


def sweep(seed: int) -> None:
    spec, data, steps = digits_run(seed)
    bnn, layout, p0, path = kfac_model(spec, data, data.x_train)
    w, _, _, eigenvalues, basis, _ = map_and_curvature(bnn, layout, data.x_train, data.y_train, "kfac", path, p0, "map",
                                                      steps, LaplaceConfig.map_lr, False, seed)
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
    print(f"digits seed {seed}, KFAC Laplace on {layout.dim} weights, MAP of {steps} steps; "
          f"test NLL / ECE per δ:")
    for g, delta in enumerate(DELTAS):
        rows = predictives(mean, cov[g], eps)
        print(f"δ {delta:11.1f}  " + "  ".join(f"{k} {nll:.4f} / {ece:.4f}" for k, (nll, ece) in
                                              ((k, nll_and_ece(p, labels)) for k, p in rows.items())))
    print("MAP NLL %.4f ECE %.4f" % nll_and_ece(torch.softmax(mean, -1), labels))


def overconfidence(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean top-class probability minus accuracy (> 0: over-confident on average, < 0: under-confident)."""
    confidence, predicted = probs.max(-1)
    return float(confidence.mean() - (predicted == labels).double().mean())


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
              f"MAP {ece_from_probs(map_probs, labels):.4f}; mean confidence − accuracy KFAC Laplace "
              f"{overconfidence(laplace, labels):+.4f}, MAP {overconfidence(map_probs, labels):+.4f}")
    rng = np.random.default_rng(0)
    differences = {"nll": lambda a, b, y: nll_and_ece(a, y)[0] - nll_and_ece(b, y)[0],
                   "ece": lambda a, b, y: ece_from_probs(a, y) - ece_from_probs(b, y)}
    points = {k: np.mean([f(a, b, y) for a, b, y in seeds]) for k, f in differences.items()}
    draws = {k: [] for k in differences}
    for _ in range(resamples):
        diffs = {k: [] for k in differences}
        for a, b, y in seeds:
            rows = torch.as_tensor(rng.integers(0, len(y), len(y)))
            for k, f in differences.items():
                diffs[k].append(f(a[rows], b[rows], y[rows]))
        for k in differences:
            draws[k].append(np.mean(diffs[k]))
    print(f"nll_difference_mean {points['nll']:.4f} se {np.std(draws['nll']):.4f} "
          f"(P > 0 over the resamples {np.mean(np.array(draws['nll']) > 0):.2f})")
    print(f"P(ECE difference > 0) over the resamples {np.mean(np.array(draws['ece']) > 0):.2f}")
    print(f"ece_difference_mean {points['ece']:.4f} se {np.std(draws['ece']):.4f}")


def layer_variances(bnn, layout: WeightLayout, w: torch.Tensor, eigenvalues: torch.Tensor, basis, x: torch.Tensor,
                    deltas=DELTAS):
    """``(logits [N, K], variances [L, N, K, G])``: the MAP's logits and each KFAC layer's share of the probit's
    logit variance diag(J_l Σ_l(δ) J_lᵀ) for every δ of ``deltas`` (G of them)."""
    unit = covariance_root("kfac", basis, torch.ones_like(eigenvalues), w.dtype)
    sizes = [layer["positions"].numel() for layer in basis]
    inv = (eigenvalues[:, None] + torch.tensor(deltas, dtype=eigenvalues.dtype)[None, :]).reciprocal().to(w.dtype)
    logits, variances = [], []
    with torch.enable_grad():
        for _, f, jac in jacobian_chunks(layout, w.detach(), x):
            squared = _projected(unit, jac.detach()).square()  # [n, K, P], layers in the eigenvalues' order
            logits.append(f.detach().double())
            variances.append(torch.stack([part @ block for part, block in
                                          zip(torch.split(squared, sizes, -1), torch.split(inv, sizes))]).double())
    return torch.cat(logits), torch.cat(variances, 1)


def kfac_fit(spec, data, rows: torch.Tensor, steps: int, seed: int, x_eval: torch.Tensor, deltas=DELTAS):
    """:func:`layer_variances` at ``x_eval`` of the KFAC Laplace whose MAP is fitted on the training ``rows`` for
    ``steps`` (the backend's own :func:`~inference.laplace.map_ggn.map_and_curvature`)."""
    x, y = data.x_train[rows], data.y_train.long()[rows]
    bnn, layout, p0, path = kfac_model(spec, data, x)
    w, _, _, eigenvalues, basis, _ = map_and_curvature(bnn, layout, x, y, "kfac", path, p0, "map", steps,
                                                      LaplaceConfig.map_lr, False, seed)
    return layer_variances(bnn, layout, w, eigenvalues, basis, x_eval, deltas)


def searched_delta(spec, data, steps: int, seed: int, num_folds: int) -> float:
    """The δ of the backend's own validation search (:func:`~inference.laplace.evidence.validation_search`, KFAC,
    probit) with ``num_folds`` folds."""
    x, y = data.x_train, data.y_train.long()
    bnn, layout, p0, path = kfac_model(spec, data, x)
    search = validation_search(bnn, layout, x, y, "kfac", path, p0, "probit", seed, False, init="map",
                               map_steps=steps, map_lr=LaplaceConfig.map_lr,
                               validation_fraction=LaplaceConfig.validation_fraction, folds=num_folds)
    return search["prior_precision_scale"]


def folds(seed: int, num_folds: int) -> None:
    spec, data, steps = digits_run(seed)
    n = data.x_train.shape[0]
    deltas = {"one split": searched_delta(spec, data, steps, seed, 1),
              f"{num_folds}-fold": searched_delta(spec, data, steps, seed, num_folds)}
    logits, variances = kfac_fit(spec, data, torch.arange(n), steps, seed, data.x_test, list(deltas.values()))
    labels = data.y_test.long()
    print(f"digits seed {seed}, KFAC Laplace, probit (one torch thread, as a run): δ by the backend's search with "
          f"one held-out split vs {num_folds}-fold cross-validation over all {n} training rows")
    rows = {"MAP": nll_and_ece(torch.softmax(logits, -1), labels)}
    for g, (label, delta) in enumerate(deltas.items()):
        rows[label] = nll_and_ece(torch.softmax(probit_logits(logits, variances.sum(0)[:, :, g]), -1), labels)
        print(f"{label:10} δ {delta:9.4g}  test NLL {rows[label][0]:.4f} ECE {rows[label][1]:.4f}")
    print(f"MAP                   test NLL {rows['MAP'][0]:.4f} ECE {rows['MAP'][1]:.4f}")
    one, kfold = rows["one split"], rows[f"{num_folds}-fold"]
    print(f"folds_test seed {seed} map {rows['MAP'][0]:.4f} {rows['MAP'][1]:.4f} "
          f"one_split {deltas['one split']:.4g} {one[0]:.4f} {one[1]:.4f} "
          f"kfold {deltas[f'{num_folds}-fold']:.4g} {kfold[0]:.4f} {kfold[1]:.4f}")


def layerwise(seed: int) -> None:
    spec, data, steps = digits_run(seed)
    x, y = data.x_train, data.y_train.long()
    order, (held,) = held_out_folds(x.shape[0], 0.2, 1, seed)  # the backend's one split (validation_fraction 0.2)
    num_fit = x.shape[0] - held.numel()
    kept = order[:num_fit]
    fits = {"validation": kfac_fit(spec, data, kept, held_out_steps(steps, x.shape[0], num_fit), seed, x[held]),
            "test": kfac_fit(spec, data, torch.arange(x.shape[0]), steps, seed, data.x_test)}

    def probit(logits, variances, index):
        return torch.softmax(probit_logits(logits, sum(v[:, :, g] for v, g in zip(variances, index))), -1)

    logits, variances = fits["validation"]
    layers, size = variances.shape[0], variances.shape[-1]
    picked = y[held].view(-1, 1)
    scores = {index: -float(probit(logits, variances, index).gather(-1, picked).log().mean())
              for index in itertools.product(range(size), repeat=layers)}
    one = min((index for index in scores if len(set(index)) == 1), key=scores.get)
    per_layer = min(scores, key=scores.get)
    logits, variances = fits["test"]
    labels = data.y_test.long()
    map_nll, map_ece = nll_and_ece(torch.softmax(logits, -1), labels)
    print(f"digits seed {seed}, KFAC Laplace, probit, δ by the validation NLL on {len(held)} held-out rows "
          f"(MAP of {steps} steps; held-out MAP of {held_out_steps(steps, x.shape[0], num_fit)}):")
    print(f"MAP                        test NLL {map_nll:.4f} ECE {map_ece:.4f}")
    eces = {}
    for label, index in (("one δ", one), ("one δ per layer", per_layer)):
        nll, eces[label] = nll_and_ece(probit(logits, variances, index), labels)
        print(f"{label:16} {[f'{DELTAS[g]:.3g}' for g in index]}  validation NLL {scores[index]:.4f}  "
              f"test NLL {nll:.4f} ECE {eces[label]:.4f}")
    print(f"layerwise_test_ece map {map_ece:.4f} one_delta {eces['one δ']:.4f} per_layer {eces['one δ per layer']:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("sweep").add_argument("--seed", type=int, default=0)
    sub.add_parser("layerwise").add_argument("--seed", type=int, default=0)
    fold = sub.add_parser("folds")
    fold.add_argument("--seed", type=int, default=0)
    fold.add_argument("--folds", type=int, default=5)
    boot = sub.add_parser("bootstrap")
    boot.add_argument("--laplace", type=Path, nargs="+", required=True, help="KFAC Laplace run folders, one per seed")
    boot.add_argument("--map", type=Path, nargs="+", required=True, help="MAP run folders, same seeds and order")
    args = parser.parse_args()
    if args.command == "sweep":
        sweep(args.seed)
    elif args.command == "layerwise":
        layerwise(args.seed)
    elif args.command == "folds":
        torch.set_num_threads(1)  # as `python -m zoo fit` (its --threads default): the runs' MAPs to the digit
        folds(args.seed, args.folds)
    else:
        bootstrap(args.laplace, args.map)


if __name__ == "__main__":
    main()
