"""How a :class:`~zoo.bnn.BayesianNetwork` evaluates its plain network: prediction mode and the
forward checks that decide between one ``vmap``-ed pass over parameter draws and a loop.

Prediction evaluates the network in eval mode: dropout is off and batch normalisation uses
its running statistics, so the output at a point does not depend on the rest of the batch;
modules named in ``active_at_prediction`` (e.g. the dropout layers an MC-dropout posterior
keeps on) stay in training mode.
"""
from __future__ import annotations

import contextlib
from typing import Mapping

import torch
from torch.func import vmap

__all__ = ["NetworkEvaluation"]


class NetworkEvaluation:
    """Mixin of :class:`~zoo.bnn.BayesianNetwork` (uses its ``net``, ``output_dim``, ``sites``,
    ``active_at_prediction``, ``batched_draws``, ``batching_error``, ``initial_values`` and
    ``forward_single``)."""

    def _enter_prediction_mode(self) -> list:
        """Switch the network to prediction mode; returns the ``(module, previous mode)`` pairs changed."""
        active = {self.net.get_submodule(name) for name in self.active_at_prediction}
        active = {m for top in active for m in top.modules()}
        changed = [(m, m.training) for m in self.net.modules() if m.training != (m in active)]
        for module, was_training in changed:
            module.training = not was_training
        return changed

    @contextlib.contextmanager
    def prediction_mode(self):
        """Evaluate the network as at prediction: eval mode except the ``active_at_prediction`` modules.

        Each module's previous mode is restored on exit.
        """
        changed = self._enter_prediction_mode()
        try:
            yield self
        finally:
            for module, was_training in changed:
                module.training = was_training

    def _example_output(self, x: torch.Tensor) -> torch.Tensor:
        """The network's output at ``x`` in prediction mode, checked to be one ``[n, O]`` tensor."""
        with torch.no_grad(), self.prediction_mode():
            out = self.net(x)
        if not isinstance(out, torch.Tensor):
            raise ValueError(
                f"{type(self.net).__name__}.forward returned a {type(out).__name__}; a BayesianNetwork needs a "
                f"network whose forward returns one tensor [n, O] of predictions (wrap it to return e.g. out[0])"
            )
        if out.dim() != 2 or out.shape[0] != x.shape[0]:
            raise ValueError(
                f"{type(self.net).__name__}.forward returned shape {tuple(out.shape)} for {x.shape[0]} inputs; "
                f"expected [n, O] = [{x.shape[0]}, outputs]"
            )
        return out

    def check_forward(self, x: torch.Tensor) -> None:
        """Check the network on example inputs ``x`` ``[n, ...]`` (the first two rows are used).

        The forward must return one ``[n, output_dim]`` tensor; and the first check decides how
        :meth:`forward_draws` evaluates a stack of draws: one ``vmap``-ed pass if it works on
        this network, else (no batching rule, e.g. ``nn.GRU`` / ``nn.LSTM``) a loop over draws,
        with the reason kept in ``batching_error``.  A network that fails draw by draw too
        raises its own error here, before any fitting.
        """
        x = x[:2]
        out = self._example_output(x)
        if out.shape[-1] != self.output_dim:
            raise ValueError(f"{type(self.net).__name__} returns {out.shape[-1]} outputs, the model was built for "
                             f"{self.output_dim}")
        if self.batched_draws is not None or not self.sites:
            return
        draws = {name: torch.stack([value, value]) for name, value in self.initial_values().items()}
        with torch.no_grad(), self.prediction_mode():
            try:
                vmap(self.forward_single, in_dims=(0, None), randomness="different")(draws, x)
            except Exception as err:  # no batching rule for some layer: fall back to the loop
                self._loop_draws(draws, x)  # a network that fails without vmap too raises here
                self.batched_draws, self.batching_error = False, f"{type(err).__name__}: {str(err).splitlines()[0]}"
            else:
                self.batched_draws = True

    def _loop_draws(self, weights: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``[S, N, O]``: :meth:`forward_single` once per draw of ``weights`` ``{site: [S, ...]}``."""
        num = next(iter(weights.values())).shape[0]
        return torch.stack([self.forward_single({n: v[s] for n, v in weights.items()}, x) for s in range(num)])

