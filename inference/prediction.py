"""Posterior predictive draws at ``N`` inputs: :class:`Prediction`, returned by ``Posterior.predict``.

Its summaries (:meth:`Prediction.summaries`) are what ``Posterior.to_arviz`` stores for
reports: predictive mean and sd, central intervals, PIT values (Gneiting & Raftery 2007)
and mean class probabilities.  A regression prediction carries its predictive mixture
(:class:`~zoo.likelihoods.PredictiveMixture`, the per-draw observation models), so its
central intervals are the exact quantiles of the mixture, the same distribution whose CDF
gives the PIT values: a target lies in the ``level`` interval iff its PIT value lies in
``[(1 − level)/2, (1 + level)/2]``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from zoo.likelihoods import PredictiveMixture

from inference.summary_table import fmt, html_table, text_table

__all__ = ["Prediction"]


@dataclass(repr=False)
class Prediction:
    """Posterior predictive draws at ``N`` inputs.

    Attributes:
        task: ``"regression"`` or ``"classification"``.
        f: regression: draws of the likelihood's predictive mean E[y | f, θ]
            (``likelihood.predictive_mean``; the location for Student-t) ``[S, N, T]`` in
            *original* target units; classification: class logits ``[S, N, K]``.
        y: observation draws (noise included) ``[S, N, T]``, or class labels ``[S, N]``.
        noise_var: regression noise variance per draw ``[S, N or 1, T]`` in original units
            (``likelihood.noise_variance``: ``[S, N, T]`` when it depends on the input,
            heteroscedastic; ``+inf`` for a Student-t with ν ≤ 2).
        log_lik: ``[S, N]`` log p(y_n | draw s) of given targets in original units, else ``None``.
        pit: ``[N, T]`` predictive mixture CDF at the given targets (regression), else ``None``.
        mixture: regression: the predictive mixture (1/S) Σ_s p(y | draw s) in original units
            (per-draw location ``[S, N, T]``, scale ``[S, N or 1, T]`` and, for a Student-t,
            degrees of freedom), from ``likelihood.mixture_params``; else ``None``.
    """

    task: str
    f: torch.Tensor
    y: torch.Tensor
    noise_var: Optional[torch.Tensor] = None
    log_lik: Optional[torch.Tensor] = None
    pit: Optional[torch.Tensor] = None
    mixture: Optional[PredictiveMixture] = None

    @property
    def num_samples(self) -> int:
        return self.f.shape[0]

    @property
    def probs(self) -> torch.Tensor:
        """Class-probability draws ``[S, N, K]`` (classification)."""
        self._require("classification")
        return torch.softmax(self.f, dim=-1)

    @property
    def mean(self) -> torch.Tensor:
        """Predictive mean ``[N, T]`` (regression) or mean class probabilities ``[N, K]``."""
        if self.task == "classification":
            return self.probs.mean(0)
        return self.f.mean(0)

    @property
    def sd(self) -> torch.Tensor:
        """Predictive sd ``[N, T]`` including observation noise: sqrt(Var[f] + E[σ²]) (law of total
        variance; ``+inf`` when a draw's noise variance is infinite)."""
        self._require("regression")
        return (self.f.var(0, unbiased=False) + self.noise_var.mean(0)).sqrt()

    @property
    def epistemic_sd(self) -> torch.Tensor:
        """sd of the network output across draws ``[N, T]`` (no observation noise)."""
        self._require("regression")
        return self.f.std(0, unbiased=False)

    def interval(self, level: float = 0.9) -> tuple[torch.Tensor, torch.Tensor]:
        """Central ``level`` predictive interval ``([N, T], [N, T])``, observation noise included: the
        ``(1 ∓ level)/2`` quantiles of the predictive mixture (exact, not from the draws ``y``)."""
        self._require("regression")
        if self.mixture is None:
            raise ValueError("this prediction carries no predictive mixture (mixture=None); make it with "
                             "Posterior.predict to get intervals")
        return self.mixture.interval(level)

    def summaries(self, levels=(0.5, 0.9)) -> dict:
        """Per-point summaries ``{name: [N] or [N, O|K]}``: what a report reads instead of predicting again.

        Regression: ``mean``, ``sd``, ``epistemic_sd``, ``lower_<p>`` / ``upper_<p>`` of the
        central interval at each level (``p`` in percent) and, with targets, the PIT values
        ``pit``; classification: the mean class probabilities ``probs``.  With targets, both
        add ``log_predictive_density``.
        """
        if self.task == "classification":
            out = {"probs": self.mean}
        else:
            out = {"mean": self.mean, "sd": self.sd, "epistemic_sd": self.epistemic_sd}
            for level in levels:
                percent = int(round(level * 100))
                out[f"lower_{percent}"], out[f"upper_{percent}"] = self.interval(level)
            if self.pit is not None:
                out["pit"] = self.pit
        if self.log_lik is not None:
            out["log_predictive_density"] = self.log_predictive_density()
        return out

    def log_predictive_density(self) -> torch.Tensor:
        """``[N]`` log of the Monte Carlo average predictive density, log(1/S Σ_s p(y_n|w_s))."""
        if self.log_lik is None:
            raise ValueError("no targets were given to predict(); pass y=... to get log densities")
        return torch.logsumexp(self.log_lik, dim=0) - math.log(self.log_lik.shape[0])

    def summary_rows(self) -> list[tuple[str, str]]:
        """``(label, value)`` rows of the notebook summary: shapes and a few averages, never the tensors."""
        S, N, O = self.f.shape
        unit = "outputs" if self.task == "regression" else "classes"
        rows = [("task", self.task), ("draws f", f"{S} draws × {N} points × {O} {unit}")]
        if self.task == "regression":
            rows += [("mean prediction", f"{fmt(float(self.mean.mean()))} (range {fmt(float(self.mean.min()))} "
                                         f"to {fmt(float(self.mean.max()))})"),
                     ("mean predictive sd", f"{fmt(float(self.sd.mean()))} (epistemic "
                                            f"{fmt(float(self.epistemic_sd.mean()))})")]
        else:
            rows.append(("mean top-class probability", fmt(float(self.mean.max(-1).values.mean()))))
        if self.log_lik is not None:
            rows.append(("mean log predictive density", fmt(float(self.log_predictive_density().mean()))))
        if self.pit is not None:
            rows.append(("mean PIT", fmt(float(self.pit.mean()))))
        return rows

    def __repr__(self) -> str:
        return text_table("Prediction", self.summary_rows())

    def _repr_html_(self) -> str:
        return html_table("Prediction", self.summary_rows())

    def _require(self, task):
        if self.task != task:
            raise ValueError(f"this quantity is defined for {task} predictions, not {self.task}")
