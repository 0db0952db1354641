"""The UCI protocol of Gal & Ghahramani 2016 as their code runs it (DropoutUncertaintyExps, after its
2018 grid-search update): ``mc-dropout`` with ``protocol="gal2016"``.

The first 80 % of the training rows (``validation_fraction`` 0.2 held out, in the data's order) fit one
network per cell of the grid ``dropout_grid`` × ``tau_grid`` (the paper's per-dataset grids ship with
the bundled UCI sets, ``Dataset.info["dropout_rates"]`` / ``["tau_values"]``), the cell with the best
validation log-likelihood (``num_samples`` MC draws) wins, and one network is refitted on all training
rows with it.  Each fit is the paper's: dropout before every whole-weight ``nn.Linear``, Glorot-uniform
weights and zero biases, the loss mean (y − f)² (standardised targets) + λ Σ‖W‖² over those weights with
λ = l²(1 − p)/(2 N τ) (l = ``length_scale`` 1e-2, N the rows of that fit), Adam (lr 1e-3, ε 1e-7) on
minibatches of 128 for ``epochs``, the noise precision held at τ (original target units, as in the
paper's code) for the predictive density.  ``epochs`` defaults to 4000, the UCI files' 40 × 100 that
the grid-search code ran for its per-split result files; the code behind the 2016 tables ran 40 × 10
= 400, which underfits here (yacht split 0, p = 0.01, τ = 0.54: train RMSE 1.69 and test RMSE 1.93
after 400 epochs, where their log has 0.92; a plain PyTorch MLP with the same settings gets 1.93).  The
grid's cells train as one ``vmap``-ed model (:func:`train_cells`).  Without ``tau_grid`` the noise
precision is learned (the MAP fit of :func:`inference.dropout.sampling.fit_dropout_map`, as with
``protocol="fixed"``) and only the rate is searched (also the choice for classification).  The paper
reports 10 000 MC draws (``num_samples=10000``).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch.func import vmap

from zoo.likelihoods import GaussianLikelihood

from inference.dropout.sampling import fit_dropout_map, masked_draws
from inference.ensembles.initialisation import member_initial_values
from inference.optim.batches import LoaderBatches
from inference.optim.training import NonFiniteLossError
from inference.posterior import SamplePosterior

__all__ = ["GAL2016_DROPOUT_GRID", "GAL2016_TRAINING", "glorot_start", "train_cells", "cell_draws", "validation_ll",
           "check_gal2016", "Gal2016Fit", "search_gal2016"]

#: the dropout rates of Gal & Ghahramani 2016's grid (the same file for every UCI set of their code)
GAL2016_DROPOUT_GRID = (0.005, 0.01, 0.05, 0.1)
#: their grid-search code's training: epochs (the UCI files' n_epochs 40 × 100, the runs of its result files), minibatch,
#: Adam's rate and a constant schedule
GAL2016_TRAINING = {"epochs": 4000, "batch_size": 128, "lr": 1e-3, "lr_schedule": "constant"}


def glorot_start(bnn, layers: dict, seed: int) -> dict:
    """Fresh site values (:func:`~inference.ensembles.initialisation.member_initial_values`) with Keras' Dense
    initialisation on ``layers``: Glorot-uniform weights U(±√(6/(in + out))) and zero biases (Glorot &
    Bengio 2010)."""
    start = member_initial_values(bnn, seed)
    generator = torch.Generator().manual_seed(seed)
    for name, layer in layers.items():
        fan_out, fan_in = layer.weight.shape
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        start[name] = ((torch.rand(layer.weight.shape, generator=generator) * 2 - 1) * bound).to(start[name])
        bias = name[: -len("weight")] + "bias"
        if bias in start:
            start[bias] = torch.zeros_like(start[bias])
    return start


def train_cells(bnn, layers: dict, x, y, cells: list, config, seed: int, progress: bool) -> dict:
    """Gal & Ghahramani 2016's fits of the grid ``cells`` [(p, τ)] as one ``vmap``-ed model; ``{site: [C, ...]}``.

    Cell c minimises mean (y − f_c)² + λ_c Σ‖W_c‖² (λ_c = l²(1 − p_c)/(2 N τ_c), W the ``layers``'
    weights) with per-example inverted dropout at rate p_c on the inputs of ``layers``; the cells share
    the minibatches.  Adam is element-wise, so each cell's updates are those it would get alone.
    ``config`` gives ``length_scale`` l, ``lr``, ``epochs`` and ``batch_size``.
    """
    from zoo.progress import tqdm

    starts = [glorot_start(bnn, layers, seed + c) for c in range(len(cells))]
    values = {n: torch.stack([s[n] for s in starts]).to(x).requires_grad_(True) for n in starts[0]}
    like = {"dtype": x.dtype, "device": x.device}
    keep = torch.tensor([1.0 - p for p, _ in cells], **like)
    decay = config.length_scale ** 2 * keep / (2 * x.shape[0] * torch.tensor([t for _, t in cells], **like))
    holder = {}

    def drop(module, args):
        h = args[0]
        return (h * (torch.rand_like(h) < holder["keep"]).to(h.dtype) / holder["keep"], *args[1:])

    def forward(v, k, xb):
        holder["keep"] = k
        return bnn.forward_single(v, xb)

    batched = vmap(forward, in_dims=(0, 0, None), randomness="different")
    optimizer = torch.optim.Adam(list(values.values()), lr=config.lr, eps=1e-7)  # Keras' Adam
    generator = torch.Generator().manual_seed(seed)
    hooks = [m.register_forward_pre_hook(drop) for m in layers.values()]
    step = 0
    try:
        with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
            torch.manual_seed(seed)
            for _ in tqdm(range(int(config.epochs)), desc=f"mc-dropout gal2016 ({len(cells)} cells)",
                          disable=not progress):
                order = torch.randperm(x.shape[0], generator=generator).to(x.device)
                for index in order.split(int(config.batch_size)):
                    f = batched(values, keep, x[index])
                    penalty = sum(values[n].pow(2).flatten(1).sum(1) for n in layers)
                    loss = ((f - y[index]).pow(2).flatten(1).mean(1) + decay * penalty).sum()
                    if not torch.isfinite(loss):
                        raise NonFiniteLossError(step, "the loss of a gal2016 grid cell")
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    step += 1
    finally:
        for hook in hooks:
            hook.remove()
    return {n: v.detach() for n, v in values.items()}


def cell_draws(bnn, point: dict, layers: dict, rate: float, tau: Optional[float], num_samples: int, seed: int):
    """Masked draws of ``point``; with ``tau`` (original units) the noise precision held at τ·scale²."""
    draws = masked_draws(point, layers, rate, num_samples, seed)
    if tau is not None:
        precision = (tau * bnn.target_scale ** 2).reshape(-1)
        draws["noise_precision"] = precision.expand(1, num_samples, precision.shape[0]).clone()
    return draws


def validation_ll(bnn, draws: dict, x, y, seed: int) -> float:
    """Mean log predictive density (original units) of the held-out rows ``(x, y)`` (``y`` standardised)."""
    if bnn.likelihood.task == "regression":
        y = y * bnn.target_scale + bnn.target_loc
    prediction = SamplePosterior(bnn, draws).predict(x, y=y, seed=seed)
    value = float(prediction.log_predictive_density().mean())
    return value if math.isfinite(value) else -math.inf


def check_gal2016(bnn, x, config) -> None:
    """Refuse a DataLoader, and a ``tau_grid`` without a learned Gaussian noise or with deterministic parameters."""
    if isinstance(x, LoaderBatches):
        raise ValueError("protocol='gal2016' holds out validation rows of the training data: pass tensors, "
                         "fit(bnn, x, y, ...), not a DataLoader")
    if config.tau_grid is None:
        return
    likelihood = bnn.likelihood
    if not (isinstance(likelihood, GaussianLikelihood) and likelihood.learn_noise):
        raise ValueError(f"tau_grid sets the Gaussian noise precision, which needs a GaussianLikelihood with "
                         f"learn_noise=True (--noise learned); got {likelihood!r} (leave tau_grid out to search "
                         f"the dropout rate only)")
    if bnn.deterministic_parameters():
        raise ValueError("protocol='gal2016' with tau_grid fits whole networks per grid cell: make every trainable "
                         "parameter random (stochastic='all') or freeze the deterministic ones")


class Gal2016Fit(NamedTuple):
    """The chosen cell (``rate``, ``tau``: ``None`` when learned), its refitted ``point`` ``{site: value}``,
    the refit's per-epoch ``history`` (``None`` for a grid cell fit), the ``validation`` rows
    ``{"dropout", "tau", "validation_ll"}`` (one per cell) and the number of held-out rows."""

    rate: float
    tau: Optional[float]
    point: dict
    history: Optional[dict]
    validation: list
    num_validation: int


def search_gal2016(bnn, x, y, config, layers: dict, seed: int, progress: bool) -> Gal2016Fit:
    """The validation search over the grid, then the refit on every training row (module docstring).

    ``config`` is the resolved ``mc-dropout`` config (``dropout_grid``, ``tau_grid``, ``validation_fraction``,
    ``num_samples`` and the training options)."""
    check_gal2016(bnn, x, config)
    num_fit = int((1 - config.validation_fraction) * x.shape[0])  # the paper's code: int(0.8 N) rows first
    if not 1 <= num_fit < x.shape[0]:
        raise ValueError(f"validation_fraction {config.validation_fraction} of {x.shape[0]} training rows leaves "
                         f"{num_fit} to fit and {x.shape[0] - num_fit} to validate; both need at least one row")
    bnn.net.eval()  # the backend applies dropout itself, at the chosen layers only
    rates = list(config.dropout_grid or GAL2016_DROPOUT_GRID)
    taus = [None] if config.tau_grid is None else list(config.tau_grid)
    cells = [(p, t) for p in rates for t in taus]
    fit_rows, held_out = (x[:num_fit], y[:num_fit]), (x[num_fit:], y[num_fit:])
    scores, state = [], {k: v.detach().clone() for k, v in bnn.net.state_dict().items()}
    if config.tau_grid is not None:
        fitted = train_cells(bnn, layers, *fit_rows, cells, config, seed, progress)
        for c, (p, t) in enumerate(cells):
            point = {n: v[c] for n, v in fitted.items()}
            scores.append(validation_ll(bnn, cell_draws(bnn, point, layers, p, t, config.num_samples, seed),
                                        *held_out, seed))
    else:
        for p, _ in cells:
            bnn.net.load_state_dict(state)  # every cell starts from the same network
            fit = fit_dropout_map(bnn, *fit_rows, config, layers, p, seed, progress)
            scores.append(validation_ll(bnn, masked_draws(fit.values, layers, p, config.num_samples, seed),
                                        *held_out, seed))
        bnn.net.load_state_dict(state)
    rate, tau = cells[max(range(len(cells)), key=scores.__getitem__)]
    history = None
    if tau is None:
        fit = fit_dropout_map(bnn, x, y, config, layers, rate, seed, progress)
        point, history = fit.values, fit.history
    else:
        point = {n: v[0] for n, v in train_cells(bnn, layers, x, y, [(rate, tau)], config, seed, progress).items()}
    validation = [{"dropout": p, "tau": t, "validation_ll": v} for (p, t), v in zip(cells, scores)]
    return Gal2016Fit(rate, tau, point, history, validation, x.shape[0] - num_fit)
