"""Observation models p(y | f, θ) for network outputs ``f``: selectable by name.

Every likelihood (:class:`~zoo.likelihoods.base.Likelihood`) works in two places:

* inside the Pyro model (:meth:`~Likelihood.observe`), on one draw of the network output,
  with the minibatch scaled to the full data size by the caller's plate;
* on stacks of posterior draws (:meth:`~Likelihood.log_prob`, :meth:`~Likelihood.sample`,
  :meth:`~Likelihood.cdf`, :meth:`~Likelihood.predictive_mean`,
  :meth:`~Likelihood.noise_variance`) with a leading sample dimension ``S`` — vectorised;
  regression likelihoods also give their draws as location-scale components
  (:meth:`~Likelihood.mixture_params`), whose :class:`PredictiveMixture` has exact CDFs and
  quantiles (central predictive intervals).

It also gives the output-space Fisher (:meth:`~Likelihood.output_fisher`, for Laplace GGNs)
and, for optimisers, a training objective (:meth:`~Likelihood.training_log_prob`).  Draws
with a ``torch.Generator`` are made on the generator's device and moved to the outputs'.

Registry (:data:`LIKELIHOODS`, built by :func:`register_likelihood`; :func:`make_likelihood`): ``gaussian``
(:class:`GaussianLikelihood`), ``heteroscedastic`` (:class:`HeteroscedasticGaussianLikelihood`),
``studentt`` (:class:`StudentTLikelihood`), ``categorical`` (:class:`CategoricalLikelihood`).
See ``docs/likelihoods.md``.
"""
from __future__ import annotations

import inspect
from typing import Optional, Union

from .base import Likelihood
from .categorical import CategoricalLikelihood
from .gaussian import LOG_VARIANCE_RANGE, GaussianLikelihood, HeteroscedasticGaussianLikelihood
from .mixture import PredictiveMixture, standard_log_density, student_t_cdf
from .studentt import StudentTLikelihood

__all__ = ["Likelihood", "GaussianLikelihood", "HeteroscedasticGaussianLikelihood", "StudentTLikelihood",
           "CategoricalLikelihood", "LIKELIHOODS", "register_likelihood", "make_likelihood", "likelihood_options",
           "likelihood_from_spec",
           "LOG_VARIANCE_RANGE", "PredictiveMixture", "standard_log_density",
           "student_t_cdf"]

LIKELIHOODS: dict[str, type] = {}
"""Registered likelihood classes by name (:func:`register_likelihood`)."""


def register_likelihood(cls: type, replace: bool = False) -> type:
    """Add the :class:`~zoo.likelihoods.base.Likelihood` subclass ``cls`` (it carries its registry ``name``) to
    :data:`LIKELIHOODS`; ``ValueError`` if the name is taken (unless ``replace``).  Returns ``cls`` (so it also
    works as a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Likelihood)) or not cls.name:
        raise ValueError(f"register_likelihood needs a Likelihood subclass with a name, got {cls!r}")
    if cls.name in LIKELIHOODS and not replace:
        raise ValueError(f"likelihood {cls.name!r} is already registered")
    LIKELIHOODS[cls.name] = cls
    return cls


register_likelihood(GaussianLikelihood)
register_likelihood(HeteroscedasticGaussianLikelihood)
register_likelihood(StudentTLikelihood)
register_likelihood(CategoricalLikelihood)


def likelihood_options(name: str) -> list[str]:
    """The option names ``make_likelihood(name, ...)`` accepts."""
    return [p for p in inspect.signature(_likelihood_class(name)).parameters if p != "self"]


def make_likelihood(name: str, **options) -> Likelihood:
    """Build a likelihood from its registry name and options.

    Raises ``ValueError`` for an unknown name (listing the valid ones) or an option the
    likelihood does not take (listing its options), and for invalid option values.
    """
    cls = _likelihood_class(name)
    valid = likelihood_options(name)
    unknown = [k for k in options if k not in valid]
    if unknown:
        raise ValueError(f"likelihood {name!r} has no option {', '.join(map(repr, unknown))}; its options are: "
                         f"{', '.join(valid) or '(none)'}")
    return cls(**options)


def likelihood_from_spec(name: Optional[str], task: Optional[str] = None, noise: Union[str, float] = "learned",
                         options: Optional[dict] = None) -> Likelihood:
    """The likelihood a run asks for by name, as the command line builds it.

    Args:
        name: a :data:`LIKELIHOODS` name; ``None`` is ``categorical`` for classification
            ``task`` and ``gaussian`` otherwise.
        task: the data's task; when given, a likelihood for the other task is a ``ValueError``.
        noise: ``"learned"`` or a fixed noise sd (Gaussian) / scale (Student-t) in standardised
            units; only ``"learned"`` is accepted for the other likelihoods.
        options: further :func:`make_likelihood` options (they override the defaults here).

    A Student-t learns its degrees of freedom unless ``options`` fix them.
    """
    name = name or ("categorical" if task == "classification" else "gaussian")
    _likelihood_class(name)
    learned = noise == "learned"
    by_noise = {
        "gaussian": {"learn_noise": True} if learned else {"noise_sd": float(noise)},
        "studentt": {"learn_scale": True} if learned else {"scale": float(noise)},
    }
    if not learned and name not in by_noise:
        raise ValueError(f"--noise does not apply to the {name} likelihood (it sets the Gaussian noise sd or the "
                         f"Student-t scale); leave it at 'learned'")
    defaults = {"studentt": {"learn_dof": True}}.get(name, {})
    likelihood = make_likelihood(name, **{**by_noise.get(name, {}), **defaults, **(options or {})})
    if task is not None and likelihood.task != task:
        valid = [n for n, cls in LIKELIHOODS.items() if cls.task == task]
        raise ValueError(f"likelihood {name!r} is for {likelihood.task} but the data are {task}; "
                         f"valid likelihoods for these data: {', '.join(valid)}")
    return likelihood


def _likelihood_class(name: str) -> type:
    try:
        return LIKELIHOODS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown likelihood {name!r}; valid likelihoods: {', '.join(LIKELIHOODS)}") from None
