"""The posterior of the variational family: a fitted guide q(w) (:class:`VariationalPosterior`).

Each prediction draws fresh, seeded samples from the guide (``seed`` fixes them, also after ``save`` /
``load``); saving stores the guide's name, options and ``state_dict``, and loading rebuilds the guide
with :func:`inference.variational.guides.build_guide`.  Everything else — prediction, ArviZ export,
the summary — is the :class:`~inference.posterior.Posterior` base's.
"""
from __future__ import annotations

import pyro
import torch

from inference.posterior import Posterior
from inference.summary_table import fmt
from inference.variational.guides import build_guide

__all__ = ["VariationalPosterior"]


class VariationalPosterior(Posterior):
    """A fitted guide q(w); each prediction draws fresh, seeded samples from it."""

    kind = "variational"

    def __init__(self, bnn, guide, guide_name: str, guide_kwargs: dict, info=None):
        super().__init__(bnn, info)
        self.guide = guide
        self.guide_name = guide_name
        self.guide_kwargs = dict(guide_kwargs)

    def _summary_rows(self):
        rows = [("guide", self.guide_name), ("draws", f"{self.default_num_samples} fresh guide draws per prediction")]
        history = self.info.get("history") or {}
        if history.get("loss"):
            chosen = self.info.get("early_stopping")
            how = (f" (chosen on {chosen['num_validation']} held-out rows, of at most {chosen['max_epochs']})"
                   if isinstance(chosen, dict) else "")
            rows.append(("final loss", f"{fmt(history['loss'][-1])} after {len(history['loss'])} epochs{how}"))
        for key in ("elbo_path", "family", "estimator"):
            if key in self.info:
                rows.append((key.replace("_", " "), str(self.info[key])))
        return rows

    def _param_chunks(self, num_samples, seed, chunk_size):
        names = self.bnn.site_names
        if not names:
            yield {}
            return
        for index, start in enumerate(range(0, num_samples, chunk_size)):
            size = min(chunk_size, num_samples - start)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(seed) * 1_000_003 + index)
                with torch.no_grad(), pyro.plate("posterior_draws", size, dim=-1):
                    trace = pyro.poutine.trace(self.guide).get_trace()
            yield {n: trace.nodes[n]["value"].detach() for n in names}

    def _state(self):
        return {"guide_name": self.guide_name, "guide_kwargs": self.guide_kwargs}, {"guide": self.guide.state_dict()}

    @classmethod
    def _from_state(cls, bnn, meta, tensors, info):
        guide = build_guide(meta["guide_name"], bnn, **meta["guide_kwargs"])
        guide.load_state_dict(tensors["guide"])
        return cls(bnn, guide, meta["guide_name"], meta["guide_kwargs"], info)
