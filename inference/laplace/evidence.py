"""The prior precision δ·P₀ of the Laplace approximation: the evidence and its tuning.

``P₀`` is the model prior's precision (``1/σ²`` per weight for Normal-family priors, else 1) and
``μ₀`` its mean (:func:`prior_moments`).  The Laplace evidence (MacKay 1992)

    log Z(δ) = log p(y | w*) − δ/2 ‖w* − μ₀‖²_{P₀} + P/2 log δ − ½ Σ_i log(λ_i + δ),

λ_i the eigenvalues of the prior-whitened GGN ``P₀^{-½} G P₀^{-½}`` (KFAC: the products β_i α_j of the
whitened factors' eigenvalues, layer by layer), is the whole Laplace evidence log p(y|w*) +
log N(w*; μ₀, (δP₀)⁻¹) + P/2 log 2π − ½ log det(G + δP₀) (the terms in log det P₀ and 2π cancel),
laplace-torch's ``log_marginal_likelihood`` (:func:`log_evidence`).  Two ways to choose δ:

* :func:`mackay_precision` maximises it by MacKay's (1992) fixed point δ ← γ / ‖w* − μ₀‖²_{P₀},
  γ = Σ λ_i/(λ_i + δ), with the MAP held (post-hoc tuning as in Immer et al. 2021 and Daxberger et
  al. 2021), for every GGN structure;
* :func:`validation_search` picks δ by the validation NLL of the classification predictive — probit,
  bridge or the Monte Carlo GLM (Kristiadi, Hein & Hennig 2020; laplace-torch's
  ``optimize_prior_precision(method="gridsearch", val_loader=...)``): a seeded random share of the
  rows is held out, the MAP and GGN are fitted on the rest (for the epochs the MAP on all rows gets), and
  δ is the point of a log grid
  (:data:`VALIDATION_GRID`) with the lowest mean NLL there (every δ from one eigen-decomposition:
  J Σ(δ) Jᵀ = J U diag((λ+δ)⁻¹) Uᵀ Jᵀ).  On a classifier whose MAP separates the training data the
  GGN is ≈ 0 and the evidence's δ leaves the Gaussian far too wide (docs/baselines.md, digits): there
  the evidence sets δ from ‖w* − μ₀‖² alone, and a network whose body has no prior grows its features
  while its random last layer shrinks (LeNet-300-100 on digits: ‖φ‖² ≈ 7 200 per image, ‖w*‖² ≈ 1,
  δ ≈ 18), so the logits keep a prior variance ≈ ‖φ‖²/δ ≈ 400 along the ~950 of 1 010 directions whose
  GGN eigenvalue is below 1, and every predictive — probit, bridge, GLM — is near-uniform (laplace-torch's
  evidence gives the same δ).

  A search whose δ is the grid's smallest or largest value has not found a minimum, only the edge of where it
  looked (:func:`grid_edge`): it warns, naming δ, the edge and ``prior_precision_grid``, and records
  ``info["prior_precision_at_edge"]`` (``"lower"``, ``"upper"`` or ``None``).  On the fidelity grid's digits-last
  (LeNet-300-100's features, issue 37) the search ended at the upper edge, δ = 10^6, on every seed: the Gaussian
  is then as narrow as the grid allows and the Laplace predictive close to the MAP's own.  (laplace-torch's ``gridsearch`` returns the
  argmin without a word.)
"""
from __future__ import annotations

import math
import warnings
from typing import Optional, Sequence

import torch

from inference.laplace.curvature import WeightLayout, effective_dim
from inference.laplace.map_ggn import covariance_root, map_and_curvature
from inference.laplace.laplace_posterior import validation_nll
from inference.optim.start import batches_per_epoch, map_epochs

__all__ = ["VALIDATION_GRID", "prior_moments", "log_evidence", "mackay_precision", "held_out_steps",
           "held_out_folds", "grid_edge", "edge_advice", "validation_search"]

#: the δ searched by ``prior_precision="validation"``: 10^-4 … 10^6, five points a decade (laplace-torch's
#: ``gridsearch`` takes a log grid of 10^-4 … 10^4)
VALIDATION_GRID = tuple(10.0 ** (k / 5) for k in range(-20, 31))


def prior_moments(bnn, layout: WeightLayout) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(μ₀ [P], P₀ [P], normal)``: the weight prior's mean and precision when every site's prior
    is a factorised Normal (``normal`` True), else zeros and ones (``normal`` False)."""
    means, precisions, normal = [], [], True
    priors = bnn.prior_distributions()
    for name, size in zip(layout.names, layout.sizes):
        d = priors[name]
        base = d.base_dist if isinstance(d, torch.distributions.Independent) else d
        if isinstance(base, torch.distributions.Normal):
            means.append(base.loc.reshape(-1).expand(size))
            precisions.append(base.scale.reshape(-1).expand(size) ** -2)
        else:
            normal = False
    if not normal:
        device = bnn.target_scale.device
        return (torch.zeros(layout.dim, dtype=torch.float64, device=device),
                torch.ones(layout.dim, dtype=torch.float64, device=device), False)
    return torch.cat(means).double(), torch.cat(precisions).double(), True


def log_evidence(log_lik: float, eigenvalues: torch.Tensor, sq_norm: float, delta: float) -> float:
    """log Z(δ), the Laplace evidence of the module docstring (MacKay 1992), from the whitened GGN's
    ``eigenvalues`` ``[P]`` and ``sq_norm`` = ‖w* − μ₀‖²_{P₀}."""
    p = eigenvalues.numel()
    return float(log_lik - 0.5 * delta * sq_norm + 0.5 * p * math.log(delta) - 0.5 * torch.log(eigenvalues + delta).sum())


def mackay_precision(eigenvalues: torch.Tensor, sq_norm: float, iterations: int = 500, tol: float = 1e-10) -> float:
    """δ maximising :func:`log_evidence`: MacKay's fixed point δ ← γ(δ)/‖w* − μ₀‖²_{P₀}, from δ = 1.

    At the fixed point ∂ log Z/∂δ = (P − δ Σ 1/(λ_i+δ) − δ‖·‖²)/(2δ) = (γ − δ‖·‖²)/(2δ) = 0.
    """
    delta = 1.0
    for _ in range(iterations):
        new = min(max(effective_dim(eigenvalues, delta) / max(sq_norm, 1e-300), 1e-10), 1e10)
        if abs(new - delta) <= tol * delta:
            return new
        delta = new
    return delta


def held_out_steps(map_steps: int, num_data: int, num_fit: int) -> int:
    """Adam steps for the MAP on ``num_fit`` of ``num_data`` rows that give it the epochs (passes over its rows,
    minibatches of :data:`~inference.optim.start.MAP_BATCH_SIZE`) that ``map_steps`` give the MAP on all rows.

    The held-out MAP stands in for the refit on all rows, so it is trained as that one is, by epochs, as the
    refits of Gal & Ghahramani's (2016) protocol are: the same steps on 80 % of the rows would be 25 % more passes
    (digits: 296 epochs instead of 228)."""
    if map_steps <= 0:
        return 0
    return map_epochs(num_data, None, map_steps) * batches_per_epoch(num_fit)


def held_out_folds(num_rows: int, validation_fraction: float, folds: int, seed: int) -> tuple[torch.Tensor, list]:
    """``(order [num_rows], held-out rows [n_k] of each fold)`` of the δ search: a permutation seeded by ``seed``, and
    slices of it.

    ``folds`` 1: the last ``num_rows − ⌊(1 − validation_fraction)·num_rows⌋`` rows of the permutation.
    ``folds`` K ≥ 2: K-fold cross-validation — the first fold as for one with ``validation_fraction`` 1/K, the
    rest of the permutation cut into K − 1 near-equal folds, so every row is held out once (and K = 5 starts
    with the one-fold split of ``validation_fraction`` 0.2)."""
    fraction = validation_fraction if folds == 1 else 1.0 / folds
    num_fit = int((1 - fraction) * num_rows)
    if not 1 <= num_fit < num_rows:
        raise ValueError(f"validation_fraction {fraction:g} of {num_rows} training rows leaves "
                         f"{num_fit} to fit and {num_rows - num_fit} to validate; both need at least one row")
    if folds > 1 and num_fit < folds - 1:
        raise ValueError(f"validation_folds {folds} needs at least {folds} training rows, got {num_rows}")
    order = torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed))
    rest = list(torch.tensor_split(order[:num_fit], folds - 1)) if folds > 1 else []
    return order, [order[num_fit:]] + rest


def grid_edge(grid: Sequence[float], chosen: float) -> Optional[str]:
    """Where ``chosen`` sits in ``grid`` (any order): ``"lower"`` when it is the smallest value, ``"upper"`` when it is
    the largest, ``None`` when it is inside (or the grid has one value: nothing was searched)."""
    values = [float(d) for d in grid]
    if len(set(values)) < 2:
        return None
    if float(chosen) == min(values):
        return "lower"
    return "upper" if float(chosen) == max(values) else None


def edge_advice(delta: float, edge: str, grid: Sequence[float]) -> str:
    """The warning of a validation search whose δ sits at the ``edge`` (:func:`grid_edge`) of ``grid``."""
    low, high = min(grid), max(grid)
    if edge == "upper":
        why = (f"the held-out NLL is lowest where the Gaussian is narrowest, its predictive the closest to the MAP's "
               f"own of those searched (as δ grows the posterior collapses toward the MAP); a larger δ may score "
               f"better still: widen the grid upward, e.g. prior_precision_grid up to {high * 100:.3g}; if it keeps "
               f"choosing the top, these held-out rows favour the MAP's own predictive (the map backend)")
    else:
        why = (f"the held-out NLL is lowest where the Gaussian is widest; a smaller δ "
               f"may score better still: widen the grid downward, e.g. prior_precision_grid from {low / 100:.3g}, or "
               f"compare prior_precision='marglik'")
    return (f"laplace: the validation search chose prior precision δ = {delta:.3g}, the {edge} edge of its grid "
            f"({low:.3g} … {high:.3g}): {why} (info['prior_precision_at_edge'] = {edge!r})")


def validation_search(bnn, layout: WeightLayout, x, y, structure: str, path: str, p0: torch.Tensor, predictive: str,
                      seed: int, progress: bool, *, init: str, map_steps: int, map_lr: float,
                      validation_fraction: float, folds: int = 1, grid: Optional[Sequence[float]] = None,
                      num_samples: int = 200, stacklevel: int = 6) -> dict:
    """δ of ``prior_precision="validation"`` (Kristiadi, Hein & Hennig 2020; laplace-torch's
    ``optimize_prior_precision(method="gridsearch")``): rows are held out (:func:`held_out_folds`: a seeded random
    ``validation_fraction`` of them, or each of ``folds`` folds in turn), the MAP and GGN are fitted on the rest
    (:func:`~inference.laplace.map_ggn.map_and_curvature` with ``init``, ``map_lr`` and the epochs that ``map_steps``
    give all the rows: :func:`held_out_steps`), and the δ of ``grid`` (``None``: :data:`VALIDATION_GRID`) whose
    ``predictive`` (``"probit"``, ``"bridge"`` or ``"glm"``, the last by ``num_samples`` Monte Carlo draws of the
    logits seeded by ``seed``: :func:`~inference.laplace.laplace_posterior.validation_nll`) has the lowest mean
    NLL over the held-out rows (of every fold together) wins.  Each
    fold's MAP starts where this search started, and the network (its deterministic parameters, which the MAP
    trains) is given back as it was, so the refit on all rows starts there too.

    Returns the ``info`` entries ``prior_precision_scale`` (δ), ``prior_precision_at_edge`` (:func:`grid_edge`: a δ
    at the grid's edge also warns, :func:`edge_advice`), ``num_validation`` (held-out rows, all folds),
    ``validation_folds``, ``validation_map_steps`` (one per fold) and ``validation``
    (``[{"prior_precision_scale": δ, "validation_nll": …}]``, one per grid point).  The warning points at the
    caller of ``fit`` (``stacklevel``: the frames above this function up to it)."""
    grid = torch.tensor(grid or VALIDATION_GRID, dtype=torch.float64)
    order, held_outs = held_out_folds(x.shape[0], validation_fraction, folds, seed)
    state = {k: v.detach().clone() for k, v in bnn.net.state_dict().items()}
    total, steps = torch.zeros(len(grid), dtype=torch.float64), []
    try:
        for held in held_outs:
            bnn.net.load_state_dict(state)
            kept = order[~torch.isin(order, held)].to(x.device)  # in the permutation's order
            held = held.to(x.device)
            steps.append(held_out_steps(map_steps, x.shape[0], kept.numel()))
            w, _, _, eigenvalues, basis, _ = map_and_curvature(bnn, layout, x[kept], y[kept], structure, path, p0,
                                                               init, steps[-1], map_lr, progress, seed)
            unit = covariance_root(structure, basis, torch.ones_like(eigenvalues), w.dtype)
            total += held.numel() * validation_nll(bnn, w.detach(), unit, eigenvalues, grid, x[held], y[held],
                                                   predictive, num_samples, seed).cpu()
    finally:
        bnn.net.load_state_dict(state)
    num_validation = sum(held.numel() for held in held_outs)
    scores = total / num_validation
    scores = torch.where(torch.isfinite(scores), scores, torch.full_like(scores, math.inf))
    delta = float(grid[int(scores.argmin())])
    edge = grid_edge(grid.tolist(), delta)
    if edge is not None:
        warnings.warn(edge_advice(delta, edge, grid.tolist()), UserWarning, stacklevel=stacklevel)
    return {"prior_precision_scale": delta, "prior_precision_at_edge": edge, "num_validation": num_validation,
            "validation_folds": folds, "validation_map_steps": steps,
            "validation": [{"prior_precision_scale": float(d), "validation_nll": float(v)}
                           for d, v in zip(grid, scores)]}
