"""One result object for every backend: the :class:`Posterior` base (its predictions are
:class:`~inference.prediction.Prediction` objects).

A posterior is a way to draw parameter sets ``{site: [S, *site_shape]}`` for a
:class:`~zoo.bnn.BayesianNetwork`:

* :class:`SamplePosterior` holds draws ``[chains, draws, *site_shape]`` from a sampler, an ensemble or any
  fit that stores its draws (:func:`member_posteriors` splits it into its chains);
* a family's own posterior lives in its family folder and subclasses one of these
  (:class:`~inference.variational.posterior.VariationalPosterior` draws fresh samples from a fitted guide;
  :class:`~inference.laplace.laplace_posterior.LaplacePosterior`, :class:`~inference.swag.swag_posterior.SWAGPosterior`).
  This module imports no family.

Predictions are vectorised: parameter draws are processed in chunks, each chunk in one
batched forward pass (``vmap``), so memory is bounded by ``chunk_size × N`` activations.
Everything is seeded: the same ``seed`` gives the same predictions, also after
``save`` / ``load``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import torch

from zoo.bnn import BayesianNetwork
from zoo.checks import check_count, check_input, check_seed, check_targets
from zoo.resources import check_memory
from zoo.likelihoods import PredictiveMixture

from inference.evaluation.arviz_export import to_inference_data
from inference.evaluation.diagnostics import convergence_row
from inference.storage.posterior_io import POSTERIOR_KINDS, load_posterior, register_kind, save_posterior, to_jsonable
from inference.prediction import Prediction
from inference.summary_table import fmt, html_table, text_table

__all__ = ["Prediction", "Posterior", "SamplePosterior", "member_posteriors", "load_posterior", "POSTERIOR_KINDS",
           "to_jsonable"]

#: upper bound on draws × points × outputs held by one batched forward pass
_DEFAULT_ELEMENT_BUDGET = 2**24
#: arrays of draws × points × outputs a prediction keeps (f, y, noise variance, mixture loc and scale)
_PREDICTION_COPIES = 5


class Posterior:
    """Base of every backend's result: draws parameters, predicts, exports, saves.

    Subclasses implement :meth:`_param_chunks`.  ``info`` holds the fit's record
    (backend, configuration, timings, loss history, ...).
    """

    kind = "base"

    def __init__(self, bnn: BayesianNetwork, info: Optional[dict] = None):
        self.bnn = bnn
        self.info = dict(info or {})

    # ------------------------------------------------------------------ draws
    @property
    def default_num_samples(self) -> int:
        return int(self.info.get("num_samples", 200))

    def _param_chunks(self, num_samples: int, seed: int, chunk_size: int) -> Iterator[dict]:
        raise NotImplementedError(self._unfitted_message())

    def _unfitted_message(self) -> str:
        return (f"{type(self).__name__}(bnn) holds no parameter draws: it is the base class of every fitted posterior. "
                f"Get a posterior from inference.fit(bnn, x, y, backend=...) (or load one saved with "
                f"inference.load_posterior(folder)), then predict with it")

    def _require_draws(self) -> None:
        """Refuse, before any work, a posterior class that cannot draw parameters (the bare base class)."""
        if type(self)._param_chunks is Posterior._param_chunks:
            raise NotImplementedError(self._unfitted_message())

    def sample_params(self, num_samples: Optional[int] = None, seed: int = 0) -> dict:
        """``{site: [S, *site_shape]}`` parameter draws (all of them, in memory)."""
        self._require_draws()
        num_samples = self._check_num_samples(num_samples)
        chunks = list(self._param_chunks(num_samples, seed, num_samples))
        return {k: torch.cat([c[k] for c in chunks]) for k in chunks[0]} if chunks and chunks[0] else {}

    def param_draws(self, num_samples: Optional[int] = None, seed: int = 0) -> dict:
        """``{site: [chains, draws, *site_shape]}`` for diagnostics (one chain by default)."""
        return {k: v.unsqueeze(0) for k, v in self.sample_params(num_samples, seed).items()}

    @property
    def num_chains(self) -> int:
        return 1

    def _check_num_samples(self, num_samples):
        return self.default_num_samples if num_samples is None else check_count(num_samples, "num_samples")

    # ------------------------------------------------------------------ prediction
    @torch.no_grad()
    def predict(
        self,
        x: torch.Tensor,
        num_samples: Optional[int] = None,
        y: Optional[torch.Tensor] = None,
        seed: int = 0,
        chunk_size: Optional[int] = None,
    ) -> Prediction:
        """Posterior predictive at inputs ``x`` (in the network's input units).

        Args:
            x: ``[N, ...]`` inputs.
            num_samples: parameter draws ``S`` (default: the posterior's own number).
            y: optional targets in *original* units (``[N, T]`` or class labels ``[N]``)
                for log densities (``bnn.likelihood.log_prob``) and PIT values (its mixture CDF).
            seed: fixes the parameter draws (variational) and observation noise.
            chunk_size: draws per batched forward pass (default from a memory budget).
        """
        self._require_draws()
        bnn = self.bnn
        x = check_input(bnn, x, "x")
        num_samples = self._check_num_samples(num_samples)
        if y is not None:
            y = self.check_targets(x, y)
        seed = check_seed(seed)
        if chunk_size is None:
            chunk_size = max(1, min(num_samples, self._default_chunk_size(x)))
        else:
            chunk_size = check_count(chunk_size, "chunk_size")
        check_memory(_PREDICTION_COPIES * num_samples * x.shape[0] * bnn.output_dim * bnn.target_scale.element_size(),
                     f"predict with num_samples={num_samples} at {x.shape[0]} points ({bnn.output_dim} outputs)",
                     "predict fewer points at a time or pass a smaller num_samples", bnn.target_scale.device)
        generator = torch.Generator().manual_seed(int(seed) + 7919)
        likelihood = bnn.likelihood
        regression = likelihood.task == "regression"
        units = self._unit_kwargs()
        fs, ys, noise_vars, log_liks, mixtures = [], [], [], [], []
        for values in self._param_chunks(num_samples, seed, chunk_size):
            f = bnn.forward_draws(values, x)
            latents = bnn.latents_of(values)
            y_draw = likelihood.sample(f, latents, generator=generator)
            if y is not None:
                log_liks.append(likelihood.log_prob(f, y, latents, **units))
            if regression:
                noise_vars.append(likelihood.noise_variance(f, latents) * bnn.target_scale**2)
                mixture = PredictiveMixture(**likelihood.mixture_params(f, latents))
                mixtures.append(mixture.to_original_units(bnn.target_loc, bnn.target_scale))
                f = bnn.to_original_units(likelihood.predictive_mean(f, latents))
                y_draw = bnn.to_original_units(y_draw)
            fs.append(f)
            ys.append(y_draw)
        f = torch.cat(fs)
        mixture = PredictiveMixture.cat(mixtures) if mixtures else None
        return Prediction(
            task=likelihood.task,
            f=f,
            y=torch.cat(ys),
            noise_var=torch.cat(noise_vars) if noise_vars else None,
            log_lik=torch.cat(log_liks) if log_liks else None,
            pit=mixture.cdf(y) if (mixture is not None and y is not None) else None,
            mixture=mixture,
        )

    def _default_chunk_size(self, x) -> int:
        """Draws per batched forward pass of :meth:`predict` at inputs ``x`` (a memory budget)."""
        return _DEFAULT_ELEMENT_BUDGET // max(1, x.shape[0] * max(self.bnn.output_dim, 64))

    def _unit_kwargs(self):
        if self.bnn.likelihood.task == "regression":
            return {"target_loc": self.bnn.target_loc, "target_scale": self.bnn.target_scale}
        return {}

    def check_targets(self, x, y) -> torch.Tensor:
        """``y`` validated against ``x`` and the model (:func:`zoo.checks.check_targets`): finite, one row per
        input; regression ``[N, T]`` float32, classification int64 labels in range."""
        y = check_targets(self.bnn, y, len(x), "y")
        return y.float() if self.bnn.likelihood.task == "regression" else y

    # ------------------------------------------------------------------ export / io
    @torch.no_grad()
    def to_arviz(self, x, y, num_samples: Optional[int] = None, seed: int = 0, include_weights: bool = True,
                 max_predictive_points: int = 16, prediction: Optional[Prediction] = None):
        """ArviZ ``InferenceData`` at data ``(x, y)`` (``y`` in original units); see :mod:`inference.evaluation.arviz_export`.

        The exported draws are :meth:`param_draws` (variational: ``num_samples`` draws in one
        chain); ``log_likelihood``, ``log_joint`` and ``f_mean`` (at up to ``max_predictive_points``
        evenly spaced points) are evaluated at exactly those draws.  ``prediction``, the
        :class:`Prediction` that ``predict(x, y=y, seed=seed)`` returned, is stored as per-point
        summaries (:meth:`Prediction.summaries`) in the ``predictions`` group, so that reports
        read it instead of predicting again; when ``predict`` drew all of the exported draws in one pass
        (``num_samples`` left at the default), ``prediction`` is also the exported log-likelihood and draws:
        the data are not predicted a second time.  1-D inputs ``x`` go to ``constant_data``.  With
        ``include_weights=False`` the weight draws are left out but the likelihood's latents (noise
        precision, degrees of freedom) are still exported.
        """
        self._require_draws()
        x = check_input(self.bnn, x, "x")
        y = self.check_targets(x, y)
        if prediction is not None and prediction.f.shape[1] != x.shape[0]:
            raise ValueError(f"prediction has {prediction.f.shape[1]} points but x has {x.shape[0]} rows")
        bnn = self.bnn
        draws = self.param_draws(num_samples, seed)
        chains, ndraws = next(iter(draws.values())).shape[:2] if draws else (1, 1)
        flat = {k: v.reshape(chains * ndraws, *v.shape[2:]) for k, v in draws.items()}
        if flat and num_samples is None and prediction is not None and prediction.log_lik is not None \
                and prediction.num_samples == chains * ndraws <= self._default_chunk_size(x):
            pred = prediction  # predict(x, y=y, seed=seed) drew exactly these draws, in this order, in one chunk
        elif flat:  # predict with exactly the exported draws, so draws and log-likelihoods align
            fixed = SamplePosterior(bnn, {k: v.unsqueeze(0) for k, v in flat.items()}, info=self.info)
            pred = fixed.predict(x, y=y, seed=seed)
        else:
            pred = self.predict(x, num_samples=1, y=y, seed=seed)
        shape = (chains, ndraws)
        log_joint = bnn.log_prior(flat) + pred.log_lik.sum(-1) if flat else pred.log_lik.sum(-1)
        count = min(max_predictive_points, x.shape[0])
        point_index = torch.as_tensor(np.unique(np.linspace(0, x.shape[0] - 1, count).round().astype(int)))
        at_points = (pred.f if pred.task == "regression" else pred.probs)[:, point_index]
        summaries, prediction_attrs = None, None
        if prediction is not None:
            summaries = prediction.summaries()
            prediction_attrs = {"num_samples": prediction.num_samples, "seed": int(seed)}
        return to_inference_data(
            task=pred.task,
            log_likelihood=pred.log_lik.reshape(*shape, -1),
            log_joint=log_joint.reshape(shape),
            observed=y,
            observation_draws=pred.y.reshape(*shape, *pred.y.shape[1:]),
            f_points=at_points.reshape(*shape, *at_points.shape[1:]),
            point_index=point_index,
            params=draws if include_weights else ({k: v for k, v in draws.items() if k in bnn.latent_priors()} or None),
            sample_stats=getattr(self, "sample_stats", None),
            predictions=summaries,
            prediction_attrs=prediction_attrs,
            x=x if x.dim() == 2 and x.shape[1] == 1 else None,
            attrs={"backend": str(self.info.get("backend", "")), "posterior_kind": self.kind,
                   "num_random": int(bnn.num_random), **_sampler_limits(self.info)},
        )

    # ------------------------------------------------------------------ summary
    def summary_rows(self) -> list[tuple[str, str]]:
        """``(label, value)`` rows of the notebook summary (``repr`` and the HTML table)."""
        bnn, info = self.bnn, self.info
        total = sum(p.numel() for p in bnn.net.parameters())
        rows = [
            ("backend", str(info.get("backend", "?"))),
            ("network", f"{type(bnn.net).__name__}, {total} parameters"),
            ("random sites", f"{len(bnn.sites)} weight sites + {len(bnn.latent_priors())} likelihood latents, "
                             f"{bnn.num_random} random scalars"),
            ("prior", repr(bnn.prior)),
            ("likelihood", repr(bnn.likelihood)),
        ]
        rows += self._summary_rows()
        rows += [(label, fmt(info[key])) for label, key in
                 (("training points", "num_data"), ("seed", "seed"), ("fit seconds", "fit_seconds")) if key in info]
        return rows

    def _summary_rows(self) -> list[tuple[str, str]]:
        return []

    def __repr__(self) -> str:
        return text_table(type(self).__name__, self.summary_rows())

    def _repr_html_(self) -> str:
        return html_table(type(self).__name__, self.summary_rows())

    # ------------------------------------------------------------------ io
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:  # a class with its own kind is loadable by that kind
            register_kind(cls)

    def _state(self) -> tuple[dict, dict]:
        """``(meta, tensors)``: JSON-serialisable settings and a (nested) dict of tensors that
        :meth:`_from_state` rebuilds this posterior from (see :mod:`inference.storage.posterior_io`)."""
        raise NotImplementedError

    @classmethod
    def _from_state(cls, bnn, meta: dict, tensors: dict, info: dict) -> "Posterior":
        raise NotImplementedError

    def save(self, directory) -> Path:
        """Write ``posterior.json``, ``posterior.pt`` and ``info.json`` to ``directory`` (no pickled
        objects; see :mod:`inference.storage.posterior_io`); reload with :func:`load_posterior`."""
        self._require_draws()
        return save_posterior(self, directory)

    @classmethod
    def load(cls, directory, net=None) -> "Posterior":
        return load_posterior(directory, net=net)


class SamplePosterior(Posterior):
    """Stored draws ``{site: [chains, draws, *site_shape]}`` from a sampler.

    ``sample_stats`` holds per-draw sampler statistics ``{name: [chains, draws]}``
    (e.g. ``diverging``, ``energy``, ``step_size``, ``acceptance_rate``, ``tree_depth``).
    """

    kind = "samples"

    def __init__(self, bnn, draws: dict, sample_stats: Optional[dict] = None, info=None):
        super().__init__(bnn, info)
        shapes = {tuple(v.shape[:2]) for v in draws.values()}
        if len(shapes) != 1:
            raise ValueError(f"all draws must share [chains, draws] leading dims, got {shapes}")
        self.draws = {k: v.detach() for k, v in draws.items()}
        self.sample_stats = {k: torch.as_tensor(v) for k, v in (sample_stats or {}).items()}
        self._chains, self._num_draws = shapes.pop()

    @property
    def num_chains(self) -> int:
        return self._chains

    @property
    def default_num_samples(self) -> int:
        return self._chains * self._num_draws

    def _summary_rows(self):
        rows = [("draws", f"{self._chains} chains × {self._num_draws} draws")]
        stats = self.sample_stats
        if "diverging" in stats:
            rows.append(("divergences", f"{int(stats['diverging'].sum())} of {stats['diverging'].numel()}"))
        for key in ("acceptance_rate", "step_size"):
            if key in stats and stats[key].numel():
                rows.append((f"mean {key.replace('_', ' ')}", fmt(float(stats[key].float().mean()))))
        convergence = convergence_row(self.info)
        return rows + ([convergence] if convergence else [])

    def _flat(self):
        return {k: v.reshape(-1, *v.shape[2:]) for k, v in self.draws.items()}

    def _param_chunks(self, num_samples, seed, chunk_size):
        flat = self._flat()
        total = self.default_num_samples
        if num_samples > total:
            raise ValueError(f"asked for {num_samples} draws but the posterior holds {total}")
        index = torch.linspace(0, total - 1, num_samples).round().long() if num_samples < total else None
        for start in range(0, num_samples, chunk_size):
            sel = slice(start, start + chunk_size)
            yield {k: (v[index[sel]] if index is not None else v[sel]) for k, v in flat.items()}

    def param_draws(self, num_samples=None, seed=0):
        return dict(self.draws)

    def _state(self):
        return {}, {"draws": self.draws, "sample_stats": self.sample_stats}

    @classmethod
    def _from_state(cls, bnn, meta, tensors, info):
        return cls(bnn, tensors["draws"], tensors["sample_stats"], info)


def member_posteriors(posterior: SamplePosterior) -> list[SamplePosterior]:
    """One single-chain :class:`SamplePosterior` per chain (sharing the network and ``info``)."""
    return [
        SamplePosterior(
            posterior.bnn,
            {name: draws[c : c + 1] for name, draws in posterior.draws.items()},
            sample_stats={name: stat[c : c + 1] for name, stat in posterior.sample_stats.items()},
            info=posterior.info,
        )
        for c in range(posterior.num_chains)
    ]


def _sampler_limits(info: dict) -> dict:
    """What the diagnostics need to read the draws: NUTS's ``max_tree_depth`` (for ``sample_stats``), and
    ``chains="members"`` when the chains are the members of a mixture (ensembles, MultiSWAG: each member its own
    mode by design, so R-hat between them measures no convergence)."""
    depth = (info.get("config") or {}).get("max_tree_depth")
    return {**({"max_tree_depth": int(depth)} if depth else {}),
            **({"chains": "members"} if info.get("chains_are_members") else {})}
