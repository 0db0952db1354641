"""Deep ensembles as published (Lakshminarayanan, Pritzel & Blundell 2017, Algorithm 1): the members'
adversarial training as one model.

Each member minimises its mean negative log-likelihood on its own minibatches (plus −log prior / N
with ``prior=True``); with ``adversarial`` the loss is ℓ(θ, x, y) + ℓ(θ, x', y) with the fast gradient
sign perturbation x' = x + ε ⊙ sign(∇ₓ ℓ(θ, x, y)) (Goodfellow et al. 2015).  The members' weights are
stacked ``[M, ...]``; one ``torch.func.vmap``-ed forward pass serves all of them (or, without ``vmap``
rules or with ``vectorise=False``, one forward pass per member in the same loop) and one Adam steps all
(Adam is element-wise, so each member's update is the one it would get alone).

* :func:`fgsm_epsilon`, :func:`fgsm_inputs` — ε per input and the perturbed inputs;
* :class:`StackedMembers` — the M members' losses on per-member minibatches ``[M, n, ...]``;
* :func:`train_members` — the loop (Adam, seeded minibatch orders, NaN/inf stop);
* :func:`fit_deep_ensemble` — the members' starts, the stages (member 0 first when it fits shared
  deterministic parameters) and the draws ``{site: [M, 1, ...]}``;
* :func:`latents_at_optimum` — each member's likelihood latents at their optimum for its final weights.

The backend is :mod:`inference.backends.deep_ensemble`.
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple, Optional

import torch
from torch.distributions import biject_to
from torch.func import vmap

from inference.ensembles.initialisation import member_initial_values
from inference.optim.latent_fit import latents_at_map
from inference.optim.potential import Potential, frozen_deterministic
from inference.optim.training import NonFiniteLossError

__all__ = ["fgsm_epsilon", "fgsm_inputs", "StackedMembers", "train_members", "DeepEnsembleFit", "fit_deep_ensemble",
           "latents_at_optimum"]


def fgsm_epsilon(x: torch.Tensor, fraction: float) -> torch.Tensor:
    """ε per input element ``x.shape[1:]``: ``fraction`` × (max − min) over the rows of ``x`` ``[N, ...]``."""
    return fraction * (x.amax(0) - x.amin(0))


def fgsm_inputs(x: torch.Tensor, gradient: torch.Tensor, epsilon: torch.Tensor) -> torch.Tensor:
    """The fast-gradient-sign perturbation x + ε ⊙ sign(∇ₓ ℓ), detached (Goodfellow et al. 2015).

    ``x`` and ``gradient`` ``[..., n, *input_shape]``; ``epsilon`` broadcastable ``input_shape``."""
    return (x + epsilon * gradient.sign()).detach()


class StackedMembers:
    """The stacked members' loss on per-member minibatches ``[M, n, ...]``, by ``vmap`` or a loop.

    ``values`` hold the weights ``{site: [M, ...]}`` and the likelihood latents in unconstrained
    coordinates (``transforms`` maps them to their support, as the MAP fit does).

    The members' passes are ``vmap``-ed over both the weights and the inputs (each member its own minibatch),
    which a network may not allow where one stack of draws on shared inputs works (``nn.GRU`` / ``nn.LSTM``
    under a stochastic head: ``bnn.batched_draws`` is ``True``, but torch has no batching rule for a recurrent
    layer's batched input).  With ``example`` rows ``[n, ...]`` the ``vmap``-ed pass is tried once on two of
    them before any training; where it fails the members run one forward pass each (``vectorised`` ``False``)
    and ``batching_error`` keeps the reason."""

    def __init__(self, bnn, vectorise: bool, num_data: int, use_prior: bool, transforms: dict,
                 example: Optional[torch.Tensor] = None):
        self.bnn, self.num_data, self.use_prior, self.transforms = bnn, num_data, use_prior, transforms
        self.batching_error: Optional[str] = None
        batched = vectorise and bnn.batched_draws is not False
        self._forward = vmap(bnn.forward_single, in_dims=(0, 0), randomness="different") if batched else None
        if batched and example is not None:
            self.batching_error = self._probe(example[:2])
            if self.batching_error is not None:
                self._forward = None
        self.vectorised = self._forward is not None

    def _probe(self, x: torch.Tensor) -> Optional[str]:
        """``None`` if the ``vmap``-ed pass runs two members on per-member inputs ``x`` ``[n, ...]``, else why not
        (a network that fails member by member too raises its own error here)."""
        weights = {n: torch.stack([v, v]) for n, v in self.bnn.initial_values().items()}
        with torch.no_grad():
            try:
                self._forward(weights, torch.stack([x, x]))
            except Exception as err:  # no batching rule for some layer: one pass per member
                self.bnn.forward_single({n: v[0] for n, v in weights.items()}, x)
                return f"{type(err).__name__}: {str(err).splitlines()[0]}"
        return None

    def constrained(self, values: dict) -> dict:
        return {n: self.transforms[n](v) if n in self.transforms else v for n, v in values.items()}

    def outputs(self, weights: dict, xb: torch.Tensor) -> torch.Tensor:
        """Network outputs ``[M, n, O]`` of member m at its inputs ``xb[m]``."""
        if self._forward is not None:
            return self._forward(weights, xb)
        return torch.stack([self.bnn.forward_single({n: v[m] for n, v in weights.items()}, xb[m])
                            for m in range(xb.shape[0])])

    def losses(self, values: dict, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        """Each member's mean negative log-likelihood on its batch (plus −log prior / N) ``[M]``."""
        current = self.constrained(values)
        f = self.outputs({n: v for n, v in current.items() if n not in self.transforms}, xb)
        nll = -self.bnn.likelihood.distribution(f, {n: current[n] for n in self.transforms}).log_prob(yb)
        nll = nll.reshape(nll.shape[0], nll.shape[1], -1).sum(-1).mean(1)  # targets summed, batch mean
        if self.use_prior:
            priors = self.bnn.prior_distributions()
            log_prior = torch.stack([sum(priors[n].log_prob(v[m]) for n, v in current.items())
                                     for m in range(nll.shape[0])])
            nll = nll - log_prior / self.num_data
        return nll


def train_members(members: StackedMembers, start: dict, x, y, config, seeds: list, epsilon, extra_params,
                  progress: bool, desc: str, stop=None):
    """Train the members ``start`` ``{site: [M, ...]}`` (member m shuffles with ``seeds[m]``).

    ``config`` has ``epochs``, ``batch_size``, ``lr`` and ``adversarial`` (the ``deep-ensemble`` config);
    ``epsilon`` is :func:`fgsm_epsilon`'s ε (``None`` without adversarial training); ``extra_params`` are
    further parameters Adam steps (shared deterministic parameters); ``stop(epoch, values)``, called after each
    epoch with the first member's site values (constrained), ends the training when it returns ``True``.

    Returns ``(values, histories, error)``: final values, per-member loss per epoch, and the
    :class:`NonFiniteLossError` that stopped the run (``None`` if it finished; ``values`` then hold the
    last finite point)."""
    from zoo.progress import tqdm

    values = {n: v.detach().clone().requires_grad_(True) for n, v in start.items()}
    params = list(values.values()) + list(extra_params)
    optimizer = torch.optim.Adam(params, lr=config.lr)
    num_data, count = x.shape[0], len(seeds)
    batch = num_data if config.batch_size is None else min(int(config.batch_size), num_data)
    generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
    histories = [[] for _ in seeds]
    step = 0
    for _ in tqdm(range(int(config.epochs)), desc=desc, disable=not progress):
        order = torch.stack([torch.randperm(num_data, generator=g) for g in generators]).to(x.device)
        sums = torch.zeros(count, dtype=x.dtype if x.is_floating_point() else torch.float32, device=x.device)
        for begin in range(0, num_data, batch):
            index = order[:, begin:begin + batch]
            xb, yb = x[index], y[index]
            if config.adversarial:
                xb = xb.detach().requires_grad_(True)
                clean = members.losses(values, xb, yb)
                gradient, = torch.autograd.grad(clean.sum(), xb, retain_graph=True)
                loss = clean + members.losses(values, fgsm_inputs(xb, gradient, epsilon), yb)
            else:
                loss = members.losses(values, xb, yb)
            total = loss.sum()
            if not torch.isfinite(total):
                return values, histories, NonFiniteLossError(step, "the loss of a deep-ensemble member")
            optimizer.zero_grad()
            total.backward()
            if not all(torch.isfinite(p.grad).all() for p in params if p.grad is not None):
                return values, histories, NonFiniteLossError(step, "the gradient of a deep-ensemble member")
            optimizer.step()
            sums += loss.detach() * index.shape[1]
            step += 1
        for m in range(count):
            histories[m].append(float(sums[m]) / num_data)
        if stop is not None:
            with torch.no_grad():
                first = {n: v[0].detach() for n, v in members.constrained(values).items()}
            if stop(len(histories[0]) - 1, first):
                break
    return values, histories, None


class DeepEnsembleFit(NamedTuple):
    """The members' result: ``draws`` ``{site: [M, 1, ...]}`` (constrained), per-member loss ``histories``
    (``[]`` for members that never trained), whether the forward pass was ``vectorised``, the
    :class:`NonFiniteLossError` that stopped training (``None`` if it finished) and, where ``vmap`` was asked for
    but the network has no batching rule for per-member inputs, the reason (:class:`StackedMembers`)."""

    draws: dict
    histories: list
    vectorised: bool
    error: Optional[NonFiniteLossError]
    batching_error: Optional[str] = None


def fit_deep_ensemble(bnn, x, y, config, seed: int, epsilon: Optional[torch.Tensor], progress: bool,
                      stop=None) -> DeepEnsembleFit:
    """Train ``config.num_members`` M members on ``x, y`` ``[N, ...]`` (member m: seed ``seed + m``).

    ``stop(epoch, values)`` (one member only: the held-out choice of the epochs,
    :mod:`inference.optim.early_stopping`) may end the training after any epoch.

    Member 0 starts from the network's weights, member m ≥ 1 from
    :func:`~inference.ensembles.initialisation.member_initial_values` under ``seed + m``; the likelihood latents
    from their prior medians.  Trainable deterministic parameters are fitted with member 0 first and held
    while the others train.  A member stopped by a NaN/inf keeps its last finite point; members after it
    keep their starting point.  The minibatch orders and starts are seeded: no global RNG is used.
    """
    count = int(config.num_members)
    if stop is not None and count != 1:
        raise ValueError("a stop callback watches one member: fit the held-out member alone (num_members=1)")
    potential = Potential(bnn, x, y)  # the latents' priors and starting values (their prior medians)
    transforms = {n: biject_to(potential.priors[n].support) for n in bnn.latent_priors()}
    latents = {n: transforms[n].inv(v) for n, v in potential.latent_init().items()}
    starts = [bnn.initial_values()] + [member_initial_values(bnn, seed + m) for m in range(1, count)]
    starts = [{**start, **latents} for start in starts]
    stacked = {n: torch.stack([s[n].to(x) for s in starts]) for n in bnn.site_names}
    members = StackedMembers(bnn, config.vectorise, x.shape[0], config.prior, transforms, example=x)
    shared = bnn.deterministic_parameters()
    stages = [(0, 1, shared), (1, count, [])] if shared else [(0, count, [])]
    values, histories, error = {}, [], None
    for first, last, extra in stages:
        if first >= last or error is not None:
            continue
        context = frozen_deterministic(bnn) if (shared and first > 0) else contextlib.nullcontext()
        with context:
            part, part_histories, error = train_members(
                members, {n: v[first:last] for n, v in stacked.items()}, x, y, config,
                [seed + m for m in range(first, last)], epsilon, extra, progress,
                f"deep-ensemble members {first + 1}-{last}/{count}", stop)
        for n, v in part.items():
            values.setdefault(n, []).append(v.detach())
        histories += part_histories
    draws = {n: torch.cat(v) for n, v in values.items()}
    if len(histories) < count:  # a member stopped early: the others keep their starting point
        draws = {n: torch.cat([d, stacked[n][d.shape[0]:]]) for n, d in draws.items()}
    with torch.no_grad():
        draws = {n: v.unsqueeze(1) for n, v in members.constrained(draws).items()}
        histories += [[] for _ in range(count - len(histories))]
    if transforms and error is None:
        draws = latents_at_optimum(bnn, draws, x, y, config.prior, config.batch_size)
    return DeepEnsembleFit(draws, histories, members.vectorised, error, members.batching_error)


def latents_at_optimum(bnn, draws: dict, x: torch.Tensor, y: torch.Tensor, use_prior: bool,
                       batch_size: Optional[int] = None) -> dict:
    """The members' draws ``{site: [M, 1, ...]}`` with each member's likelihood latents (a learned noise precision,
    a Student-t's scale and ν) at their optimum for its final weights on every training row: maximum likelihood, or
    MAP with ``use_prior`` (:func:`~inference.optim.latent_fit.latents_at_map`).

    Minibatch Adam at a constant rate leaves a member's latents behind the optimum of its own loss: on UCI energy
    (8-50-1, 239 epochs of 7 steps) members' noise sd 0.53–0.61 against 0.40–0.58 at the optimum for the same
    weights, as it left the ``map`` backend's noise precision at 310 against 901 (issue 38).  A member is the
    maximum-likelihood fit the paper describes only with its latents at their optimum."""
    rows = x.shape[0]
    batch = rows if batch_size is None else max(1, min(int(batch_size), rows))
    batches = [(x[i:i + batch], y[i:i + batch]) for i in range(0, rows, batch)]
    fitted = {n: v.clone() for n, v in draws.items()}
    count = next(iter(draws.values())).shape[0]
    for m in range(count):
        member = {n: v[m, 0] for n, v in draws.items()}
        for name, value in latents_at_map(bnn, member, batches, use_prior=use_prior).items():
            fitted[name][m, 0] = value
    return fitted
