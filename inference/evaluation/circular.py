"""Scoring angles on the circle: the wrapped predictive density of periodic regression outputs.

An output that is an angle (period P, e.g. 360°) predicted as a plain real number is scored
unfairly at the wrap: a prediction of −1.8° for a target at 359.8° is 2° off on the circle but
361° off on the line, where a narrow Gaussian gives it a log density of −10⁴.  The *wrapped*
predictive density of a component p(y | s) is

    p_P(y | s) = Σ_k p(y + kP | s),   k ∈ ℤ,

the density of the component's draws mapped onto [y − P/2, y + P/2) (Mardia & Jupp 2000, §3.5:
the wrapped normal and wrapped Student-t).  With the difference d = wrap(y − loc_s) ∈ [−P/2, P/2)
the sum runs over |k| ≤ K with K = ⌈10 · scale / P⌉ + 1 (K = 1 for a scale below P/10; at least 8 for a
Student-t: within 10⁻⁴ nats of the full sum for ν ≥ 1), and the
component's mass beyond ±(K + ½)P, where its density changes slowly over a period, is added as
spread evenly over the circle (mass / P: the midpoint rule for the remaining windings; negligible for a
Gaussian, whose left-out terms lie beyond 10 scales, and the main correction for a heavy-tailed
Student-t).  A component wider than the circle (scale > P) is uniform on it, density 1/P (for a
Gaussian within a factor 1 ± 2e^(−2π²)).  Outputs with no period keep
their plain density; the outputs of one draw are independent given the draw, so the per-point
log-likelihood sums over them, and the predictive density averages over draws (log-mean-exp), as
:func:`inference.evaluation.metrics.test_log_likelihood` does on the line.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from zoo.likelihoods import standard_log_density, student_t_cdf

__all__ = ["wrapped_component_log_density", "circular_log_predictive_density", "circular_trivial_metrics",
           "periods_tensor", "circular_difference", "circular_rmse"]

#: terms beyond this many component scales from the target are left out of the wrapped sum
WRAP_REACH = 10.0
#: windings summed at least for a Student-t, whose tails the midpoint rule approximates only beyond them
STUDENT_T_WINDINGS = 8


def periods_tensor(period: Sequence[Optional[float]], width: int) -> torch.Tensor:
    """``[T]`` float64 periods, NaN for an output on the real line; ``ValueError`` unless one per output."""
    period = list(period)
    if len(period) != width:
        raise ValueError(f"period has {len(period)} entries for {width} outputs; give one per output (None for a "
                         f"real-valued output)")
    return torch.tensor([math.nan if p is None else float(p) for p in period], dtype=torch.float64)


def circular_difference(d: torch.Tensor, period: torch.Tensor) -> torch.Tensor:
    """``d`` ``[..., T]`` with its periodic outputs (``period`` ``[T]``, NaN: none) mapped into [−P/2, P/2)."""
    d = d.double()
    period = period.to(d.device)
    periodic = ~torch.isnan(period)
    wrapped = torch.remainder(d + period / 2, period) - period / 2
    return torch.where(periodic, wrapped, d)


def circular_rmse(mean: torch.Tensor, y: torch.Tensor, period: Sequence[Optional[float]]) -> float:
    """RMSE over all points and outputs of ``mean − y`` (``[N, T]``), periodic outputs by the angular distance."""
    return float((circular_difference(mean - y, periods_tensor(period, mean.shape[-1])) ** 2).mean().sqrt())


def _standard_cdf(z: torch.Tensor, df: Optional[torch.Tensor]) -> torch.Tensor:
    return torch.special.ndtr(z) if df is None else student_t_cdf(z, df)


def wrapped_component_log_density(loc: torch.Tensor, scale: torch.Tensor, df: Optional[torch.Tensor],
                                  y: torch.Tensor, period: torch.Tensor) -> torch.Tensor:
    """``[S, N, T]`` log p(y | s) of location-scale components (``loc`` ``[S, N, T]``, ``scale`` and ``df``
    broadcastable to it; ``df`` None: Normal), wrapped with ``period`` ``[T]`` (NaN: plain), at ``y``
    ``[N, T]``; float64."""
    loc = loc.double()
    scale = scale.double().expand(loc.shape)
    df = None if df is None else df.double().expand(loc.shape)
    y = y.double().to(loc.device).expand(loc.shape[1:])
    period = period.to(loc.device)
    plain = standard_log_density((y - loc) / scale, df) - scale.log()
    periodic = ~torch.isnan(period)
    if not bool(periodic.any()):
        return plain
    P = period[periodic]
    d = circular_difference(y - loc, period)[..., periodic]  # [S, N, T'] in [−P/2, P/2)
    s = scale[..., periodic]
    wide = s > P  # wrapped, a component wider than the circle is uniform on it to ~e^(−2π²)
    s_sum = torch.where(wide, P.expand(s.shape), s)
    reach = max(int(math.ceil(WRAP_REACH * float((s_sum / P).max()))) + 1, 1 if df is None else STUDENT_T_WINDINGS)
    k = torch.arange(-reach, reach + 1, dtype=torch.float64, device=loc.device).reshape(-1, 1, 1, 1)
    z = (d + k * P) / s_sum  # [2K + 1, S, N, T']
    dof = None if df is None else df[..., periodic]
    windings = torch.logsumexp(standard_log_density(z, dof), dim=0) - s_sum.log()
    edge = (reach + 0.5) * P  # the windings cover [d − edge, d + edge]; beyond, the tails spread over the circle
    tail = _standard_cdf((d - edge) / s_sum, dof) + _standard_cdf(-(d + edge) / s_sum, dof)
    wrapped = torch.logaddexp(windings, tail.clamp_min(1e-300).log() - P.log())
    wrapped = torch.where(wide, -P.log().expand(s.shape), wrapped)
    out = plain.clone()
    out[..., periodic] = wrapped
    return out


def circular_log_predictive_density(pred, y: torch.Tensor, period: Sequence[Optional[float]]) -> torch.Tensor:
    """``[N]`` log (1/S) Σ_s Π_t p_{P_t}(y_nt | s): the predictive density of a regression
    :class:`~inference.prediction.Prediction` (its ``mixture``) with the periodic outputs wrapped.

    Equals ``pred.log_predictive_density()`` (up to float64 rounding) when no output has a period."""
    if pred.task != "regression" or pred.mixture is None:
        raise ValueError("circular scoring needs a regression prediction with its predictive mixture "
                         "(Posterior.predict(x, y=y))")
    mixture = pred.mixture
    y = torch.as_tensor(y).reshape(mixture.loc.shape[1:])
    per_draw = wrapped_component_log_density(mixture.loc, mixture.scale, mixture.df, y,
                                             periods_tensor(period, mixture.loc.shape[-1])).sum(-1)  # [S, N]
    return torch.logsumexp(per_draw, dim=0) - math.log(per_draw.shape[0])


def circular_trivial_metrics(y_train: torch.Tensor, y: torch.Tensor, period: Sequence[Optional[float]]) -> dict:
    """The trivial predictor Normal(ȳ_train, s_train²) per output scored with its periodic outputs on the
    circle: ``rmse_circular`` and ``test_ll_circular`` (the circular counterparts of
    :func:`inference.evaluation.sanity.trivial_predictor_metrics`)."""
    y_train = y_train.reshape(y_train.shape[0], -1).double()
    y = y.reshape(y.shape[0], -1).double()
    loc, scale = y_train.mean(0), y_train.std(0, unbiased=False).clamp_min(1e-12)
    density = wrapped_component_log_density(loc.expand(1, *y.shape), scale.expand(1, 1, -1), None, y,
                                            periods_tensor(period, y.shape[-1]))
    return {"rmse_circular": circular_rmse(loc.expand_as(y), y, period),
            "test_ll_circular": float(density[0].sum(-1).mean())}
