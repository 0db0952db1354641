"""The posterior predictive of a regression likelihood as data: :class:`PredictiveMixture`.

Over ``S`` parameter draws the posterior predictive is the equal-weight mixture
``(1/S) Σ_s p(y | draw s)``.  For every regression likelihood here each component is a
location-scale distribution: ``Normal(loc_s, scale_s)`` (Gaussian with fixed, learned or
heteroscedastic noise) or ``StudentT(ν_s, loc_s, scale_s)``; a likelihood's
:meth:`~zoo.likelihoods.base.Likelihood.mixture_params` gives those per-draw parameters.

The mixture CDF is exact; its quantiles have no closed form for ``S > 1`` and are found per
point and target by Halley's method on the CDF (Newton's method with the density's slope as a
second-order correction), safeguarded by a bracket (a bisection step whenever a step would
leave it), in float64.  The central ``level`` interval
``[q((1 − level)/2), q((1 + level)/2)]`` is the one whose coverage the PIT measures
(Gneiting & Raftery 2007): a target lies in it iff its PIT value lies in
``[(1 − level)/2, (1 + level)/2]``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import scipy.special
import torch

__all__ = ["PredictiveMixture", "standard_log_density", "student_t_cdf"]

#: upper bound on draws × points per block of a quantile solve (bounds the float64 work memory)
_BLOCK_ELEMENTS = 2**20


@dataclass(frozen=True, repr=False)
class PredictiveMixture:
    """Equal-weight mixture of ``S`` location-scale components per point and target.

    Attributes:
        loc: component locations ``[S, N, T]``.
        scale: component scales (the Gaussian sd, the Student-t scale), broadcastable to
            ``[S, N, T]``: ``[S, N, T]`` when the noise depends on the input, else ``[S, 1, T]``.
        df: Student-t degrees of freedom ν broadcastable to ``[S, N, T]`` (``[S, 1, T]``),
            or ``None`` for Gaussian components.

    Units are those of the tensors (standardised as a likelihood returns them, original after
    :meth:`to_original_units`); results have ``loc``'s dtype and device.
    """

    loc: torch.Tensor
    scale: torch.Tensor
    df: Optional[torch.Tensor] = None

    def __post_init__(self):
        if self.loc.dim() != 3:
            raise ValueError(f"a predictive mixture needs locations [S, N, T], got shape {tuple(self.loc.shape)}")
        for name in ("scale", "df"):
            value = getattr(self, name)
            if value is not None:
                try:
                    torch.broadcast_shapes(value.shape, self.loc.shape)
                except RuntimeError:
                    raise ValueError(f"predictive mixture {name} of shape {tuple(value.shape)} does not broadcast "
                                     f"against the locations {tuple(self.loc.shape)}") from None

    @property
    def num_components(self) -> int:
        return self.loc.shape[0]

    def __repr__(self) -> str:
        family = "Normal" if self.df is None else "StudentT"
        S, N, T = self.loc.shape
        return f"PredictiveMixture({S} {family} components × {N} points × {T} targets)"

    def to_original_units(self, target_loc: torch.Tensor, target_scale: torch.Tensor) -> "PredictiveMixture":
        """The mixture of ``y = target_loc + target_scale · y_std`` (``[T]`` each)."""
        return PredictiveMixture(self.loc * target_scale + target_loc, self.scale * target_scale, self.df)

    @staticmethod
    def cat(parts: list["PredictiveMixture"]) -> "PredictiveMixture":
        """The components of several mixtures (chunks of draws) over the same points, concatenated."""
        if any((p.df is None) != (parts[0].df is None) for p in parts):
            raise ValueError("cannot concatenate Normal and Student-t predictive mixtures")
        S = [p.num_components for p in parts]

        def stack(name):
            values = [getattr(p, name) for p in parts]
            if values[0] is None:
                return None
            return torch.cat([v.expand(s, *v.shape[1:]) for v, s in zip(values, S)])

        return PredictiveMixture(torch.cat([p.loc for p in parts]), stack("scale"), stack("df"))

    def cdf(self, y: torch.Tensor) -> torch.Tensor:
        """Mixture CDF ``(1/S) Σ_s F(y | component s)`` ``[N, T]`` at ``y`` ``[N, T]``."""
        loc, scale, df, work = self._flat()
        value = torch.as_tensor(y).to(work, torch.float64).expand(self.loc.shape[1:]).reshape(-1)
        cdf = _cdf_and_density(loc, scale, df, value)[0]
        return cdf.reshape(self.loc.shape[1:]).to(self.loc.device, self.loc.dtype)

    def quantile(self, prob: float, xtol: float = 1e-8, max_iter: int = 200) -> torch.Tensor:
        """The ``prob`` quantile ``[N, T]``: ``q`` with mixture CDF ``F(q) = prob``.

        Every component's quantile ``loc_s + scale_s · q_s`` (``q_s`` the standard Normal or
        Student-t quantile) is exact; the mixture's lies between the outermost ones and is solved
        from their mean to ``xtol`` times the smallest component scale at that point (float64),
        so the CDF at the returned value (before the cast to ``loc``'s dtype) is ``prob`` to
        about ``xtol``.
        """
        prob = _probability(prob, "quantile probability")
        loc, scale, df, work = self._flat()
        standard = _standard_quantile(prob, None if self.df is None else self.df.to(work, torch.float64), work,
                                      xtol, max_iter)
        standard = standard.expand(self.loc.shape).reshape(loc.shape)
        block = max(1, _BLOCK_ELEMENTS // loc.shape[0])
        parts = []
        for i in range(0, loc.shape[1], block):
            cols = slice(i, i + block)
            component = loc[:, cols] + scale[:, cols] * standard[:, cols]
            parts.append(_solve(loc[:, cols], scale[:, cols], None if df is None else df[:, cols], prob,
                                component.min(0).values, component.max(0).values, component.mean(0),
                                xtol * scale[:, cols].min(0).values, max_iter))
        return torch.cat(parts).reshape(self.loc.shape[1:]).to(self.loc.device, self.loc.dtype)

    def interval(self, level: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Central ``level`` interval ``([N, T], [N, T])``: the ``(1 ∓ level)/2`` quantiles."""
        level = _probability(level, "interval level")
        return self.quantile((1 - level) / 2), self.quantile((1 + level) / 2)

    def _flat(self):
        """``(loc, scale, df or None)`` as float64 ``[S, N·T]`` on the working device (CPU for MPS)."""
        work = torch.device("cpu") if self.loc.device.type == "mps" else self.loc.device
        S = self.loc.shape[0]

        def flat(v):
            return None if v is None else v.to(work, torch.float64).expand(self.loc.shape).reshape(S, -1)

        return flat(self.loc), flat(self.scale), flat(self.df), work


def student_t_cdf(t: torch.Tensor, dof: torch.Tensor) -> torch.Tensor:
    """CDF of the standard Student-t with ``dof`` degrees of freedom at ``t`` (broadcast).

    ``F(t) = 1 − ½ I_x(ν/2, ½)`` for ``t > 0`` (``½ I_x`` for ``t ≤ 0``) with ``x = ν/(ν + t²)`` and
    ``I`` the regularised incomplete beta function — SciPy's ``special.stdtr`` (Cephes, float64),
    evaluated on the CPU; no gradient (the CDF serves PIT values, coverage and intervals, never
    a training loss).  Returns ``t``'s dtype and device.
    """
    t64 = t.detach().to("cpu", torch.float64)
    nu = torch.as_tensor(dof).detach().to("cpu", torch.float64).expand_as(t64)
    return torch.from_numpy(scipy.special.stdtr(nu.numpy(), t64.numpy())).to(t.device, t.dtype)


def standard_log_density(z: torch.Tensor, df: Optional[torch.Tensor] = None) -> torch.Tensor:
    """log density of the standard Normal (``df`` None) or standard Student-t with ``df`` degrees of
    freedom at ``z`` (broadcast); a location-scale component's is this at (y − loc)/scale, minus log scale."""
    if df is None:
        return -0.5 * z**2 - 0.5 * math.log(2 * math.pi)
    return (torch.lgamma(0.5 * (df + 1)) - torch.lgamma(0.5 * df) - 0.5 * torch.log(math.pi * df)
            - 0.5 * (df + 1) * torch.log1p(z**2 / df))


def _probability(value, what: str) -> float:
    """``value`` as a float in (0, 1), else a ``ValueError`` naming ``what``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not 0 < number < 1:
        raise ValueError(f"{what} must be in (0, 1), got {value!r}")
    return number


def _cdf_and_density(loc, scale, df, x):
    """Mixture CDF, density and density derivative ``[M]`` at ``x`` ``[M]`` of components ``[S, M]`` (float64)."""
    z = (x - loc) / scale
    if df is None:
        cdf = torch.special.ndtr(z)
        slope = -z  # d log pdf / dz
    else:
        cdf = student_t_cdf(z, df)
        slope = -(df + 1) * z / (df + z**2)
    density = standard_log_density(z, df).exp() / scale
    return cdf.mean(0), density.mean(0), (density * slope / scale).mean(0)


def _standard_quantile(prob: float, df: Optional[torch.Tensor], device: torch.device, xtol: float,
                       max_iter: int) -> torch.Tensor:
    """The ``prob`` quantile of the standard Normal (a scalar, ``df`` None) or of standard
    Student-t distributions with degrees of freedom ``df`` (``df``'s shape), float64 on ``device``."""
    z = torch.special.ndtri(torch.tensor(prob, dtype=torch.float64, device=device))
    if df is None:
        return z
    nu = df.reshape(1, -1)
    zero, one = torch.zeros_like(nu), torch.ones_like(nu)
    # a Student-t quantile is further out than the Normal one: widen from ±max(|z|, 1) until it is bracketed
    reach = torch.clamp(z.abs(), min=1.0).expand(nu.shape[1]).clone()
    lo, hi = _widen(zero, one, nu, -reach, reach.clone(), prob)
    start = torch.clamp(z.expand(nu.shape[1]), lo, hi)
    return _solve(zero, one, nu, prob, lo, hi, start, torch.full_like(reach, xtol), max_iter).reshape(df.shape)


def _solve(loc, scale, df, prob, lo, hi, x, tol, max_iter):
    """``[M]`` solutions of ``F(q) = prob`` for the mixtures of components ``[S, M]`` (float64), from
    the start ``x`` in the bracket ``F(lo) ≤ prob ≤ F(hi)`` (``[M]`` each) to ``tol`` ``[M]``:
    Halley steps on the mixture CDF, a bisection step whenever one would leave the bracket."""
    lo, hi, x = lo.clone(), hi.clone(), x.clone()
    eps = 4 * torch.finfo(torch.float64).eps
    active = torch.arange(x.shape[0], device=x.device)
    for _ in range(max_iter):
        if active.numel() == 0:
            break
        xa, la, ha = x[active], lo[active], hi[active]
        cdf, density, derivative = _cdf_and_density(loc[:, active], scale[:, active],
                                                     None if df is None else df[:, active], xa)
        below = cdf < prob
        la, ha = torch.where(below, xa, la), torch.where(below, ha, xa)
        residual = cdf - prob
        halley = xa - 2 * density * residual / (2 * density**2 - residual * derivative)
        inside = torch.isfinite(halley) & (halley > la) & (halley < ha)
        limit = tol[active] + eps * xa.abs()
        # converged: the step (the distance to the root, to second order) or the bracket is within tol
        close = (halley - xa).abs() <= limit
        done = close | (ha - la <= limit)
        x[active] = torch.where(close, xa, torch.where(inside, halley, 0.5 * (la + ha)))
        lo[active], hi[active] = la, ha
        active = active[~done]
    return x


def _widen(loc, scale, df, lo, hi, prob, max_doublings: int = 1100):
    """Move ``lo`` down and ``hi`` up (doubling steps) until ``F(lo) ≤ prob ≤ F(hi)``."""
    for end, outside, sign in ((lo, lambda c: c > prob, -1.0), (hi, lambda c: c < prob, 1.0)):
        step = hi - lo
        for _ in range(max_doublings):
            bad = outside(_cdf_and_density(loc, scale, df, end)[0])
            if not bool(bad.any()):
                break
            end.add_(torch.where(bad, sign * step, torch.zeros_like(step)))
            step = torch.where(bad, 2 * step, step)
    return lo, hi
