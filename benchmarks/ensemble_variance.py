"""What makes an ensemble's predictive variance wrong: one candidate at a time, on a few splits (issue 39).

Each variant is a run of the run layer (:func:`lab.runs.execution.execute`, the same fit and evaluation as
``python -m zoo fit``) with some spec fields or backend options changed; per split it records the metrics
of the run (RMSE, test LL and 90 % coverage of the predictive mixture, the training LL, ``failed_fit``) and
more read from the same prediction:

* the paper's Gaussian: test LL and 90 % coverage of N(μ*, σ*²) with the mixture's mean and variance,
  μ* = (1/M) Σ μ_m, σ*² = (1/M) Σ (σ_m² + μ_m²) − μ*² (Lakshminarayanan et al. 2017, Section 2.4), in place of the
  mixture's own density and quantiles;
* the members: their mean 90 % coverage (each member's own Gaussian), against the mixture's;
* the two parts of the predictive sd, averaged over the test points (original units): ``noise_sd``, the members'
  root mean variance ((1/M) Σ σ_m²)^½, and ``spread_sd``, the sd of the member means; ``at_floor``, the share of
  the members' σ_m(x) at the variance head's floor (σ = 10⁻³ standardised units).

It prints one line per variant: means over the splits (and the number of runs flagged ``failed_fit``)::

    python benchmarks/ensemble_variance.py --data uci:bostonHousing --backend ensemble --splits 0 1 2 \\
        --variant default --variant 'beta=1:likelihood_options.beta=1.0'

A variant is ``NAME`` or ``NAME:FIELD=VALUE,FIELD=VALUE``; ``FIELD`` is a :class:`lab.runs.spec.RunSpec` field
(``epochs``, ``lr``, ``prior_scale``, ``likelihood``, ...), ``option.KEY`` a backend option, or
``likelihood_options.KEY``; values are read as JSON where they parse (``true``, ``0.1``), else as strings.
"""
from __future__ import annotations

import argparse
import json
import math
import time
import warnings

import torch

from lab.runs.spec import RunSpec
from lab.runs.execution import execute

__all__ = ["parse_variant", "gaussian_moment_metrics", "run_variant", "main"]

_Z90 = 1.6448536269514722  # the standard normal's 95 % quantile: the central 90 % interval is μ ± z σ


def parse_variant(text: str) -> tuple[str, dict, dict, dict]:
    """``NAME[:FIELD=VALUE,...]`` → ``(name, spec fields, backend options, likelihood options)``."""
    name, _, assignments = text.partition(":")
    fields, options, likelihood = {}, {}, {}
    for item in filter(None, assignments.split(",")):
        key, _, raw = item.partition("=")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if key.startswith("option."):
            options[key[len("option."):]] = value
        elif key.startswith("likelihood_options."):
            likelihood[key[len("likelihood_options."):]] = value
        else:
            fields[key] = value
    return name, fields, options, likelihood


def gaussian_moment_metrics(mixture, y: torch.Tensor) -> dict:
    """Test LL (mean over points, summed over targets) and 90 % coverage of the Gaussian with the mixture's
    mean and variance at targets ``y`` ``[N, T]`` (original units, as the mixture)."""
    loc, scale = mixture.loc.double(), mixture.scale.double().expand_as(mixture.loc)
    mean = loc.mean(0)
    variance = (scale ** 2 + loc ** 2).mean(0) - mean ** 2
    sd = variance.clamp_min(1e-300).sqrt()
    y = y.double().reshape(mean.shape)
    log_density = torch.distributions.Normal(mean, sd).log_prob(y).sum(-1)
    inside = ((y - mean).abs() <= _Z90 * sd).double().mean()
    return {"gauss_test_ll": float(log_density.mean()), "gauss_coverage_90": float(inside),
            "noise_sd": float((scale ** 2).mean(0).sqrt().mean()), "spread_sd": float(loc.std(0, unbiased=False).mean())}


def run_variant(data: str, backend: str, split: int, fields: dict, options: dict, likelihood_options: dict,
                seed: int = 0) -> dict:
    """One run's metrics (see the module docstring)."""
    spec = RunSpec(data=data, model="mlp", stochastic=fields.pop("stochastic", "all"), backend=backend, split=split,
                   seed=seed, backend_options=options, likelihood_options=likelihood_options, **fields)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = execute(spec, progress=False)
    metrics = result.metrics
    row = {k: metrics.get(k) for k in ("rmse", "test_ll", "coverage_90", "train_ll", "failed_fit")}
    row["seconds"] = time.perf_counter() - started
    if result.prediction.mixture is not None:
        mixture = result.prediction.mixture
        row.update(gaussian_moment_metrics(mixture, result.data.y_test_original()))
        floor = 1.01e-3 * result.data.y_scale.reshape(-1).to(mixture.scale)  # σ ≥ 10⁻³ standardised units
        row["at_floor"] = float((mixture.scale.expand_as(mixture.loc) <= floor).double().mean())
    chosen = result.posterior.info.get("early_stopping")
    row["chosen_epochs"] = chosen["epochs"] if chosen else result.posterior.info.get("config", {}).get("epochs")
    members = metrics.get("members")
    row["member_coverage_90"] = members["member_mean"]["coverage_90"] if members else float("nan")
    return row


def _mean(rows: list, key: str) -> float:
    values = [float(r[key]) for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else math.nan


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--splits", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variant", action="append", default=[], help="NAME[:FIELD=VALUE,...] (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-split", action="store_true", help="also print every split's row")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    keys = ("rmse", "test_ll", "coverage_90", "gauss_test_ll", "gauss_coverage_90", "member_coverage_90",
            "noise_sd", "spread_sd", "at_floor", "train_ll", "chosen_epochs", "seconds")
    print(f"{args.data} {args.backend} splits {args.splits}: means over splits")
    print("variant | " + " | ".join(keys) + " | failed_fit")
    for text in args.variant or ["default"]:
        name, fields, options, likelihood = parse_variant(text)
        rows = []
        for k in args.splits:
            rows.append(run_variant(args.data, args.backend, k, dict(fields), dict(options), dict(likelihood),
                                    args.seed))
            if args.per_split:
                print(f"  {name} split {k} | " + " | ".join(f"{float(rows[-1].get(c, math.nan)):.4g}" for c in keys)
                      + f" | {rows[-1]['failed_fit']}", flush=True)
        failed = sum(bool(r["failed_fit"]) for r in rows)
        print(f"{name} | " + " | ".join(f"{_mean(rows, c):.4g}" for c in keys) + f" | {failed}", flush=True)


if __name__ == "__main__":
    main()
