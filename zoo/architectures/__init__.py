"""Plain deterministic architectures of the zoo.

Every network here is an ordinary :class:`torch.nn.Module` whose ``forward`` returns the
predictions only (never ``(out, kl)``).  Priors and the choice of which parameters are
stochastic are applied afterwards by other code that addresses parameters by their
``named_parameters()`` names, so the submodule names are chosen to make selection natural:

* :class:`MLP` / :class:`LeNet300100` (LeCun et al. 1998) — ``fc1, fc2, ..., out``
  (:mod:`zoo.architectures.mlp`);
* :class:`MultiLSTM` (Bagga et al. 2025, Fig. 1) — ``lstm_phi1, lstm_phi, lstm_phi2`` and
  ``head_phi1, head_phi, head_phi2`` (:mod:`zoo.architectures.lstm`);
* :class:`SmallCNN` — ``conv1, conv2, fc1, fc2, out`` (:mod:`zoo.architectures.cnn`);
* :class:`TransformerClassifier` (Vaswani et al. 2017) — ``embedding, pos_embedding,
  attention, norm1, ffn.fc1, ffn.fc2, norm2, head`` (:mod:`zoo.architectures.transformer`).

All of them work under :func:`torch.func.functional_call`.  All but the default
(fused) :class:`MultiLSTM` also work under :func:`torch.func.vmap` over a leading batch of
parameter sets (``vmap(lambda p, x: functional_call(net, p, (x,)), in_dims=(0, None))``):
PyTorch has no batching rule for the fused ``aten::lstm`` kernel, so
``MultiLSTM(unrolled=True)`` provides a step-by-step implementation with the *same*
parameter names and values that does vmap.

:func:`build_architecture` builds any of them by name from the one registry
:data:`ARCHITECTURES` (:mod:`zoo.architectures.registry`), which also holds how a saved
posterior describes and rebuilds each of them; :func:`register_architecture` adds one.
:func:`parametrised_modules_in_forward_order` and :func:`output_modules` tell which modules
are "last" (for the ``last`` stochastic selector; :mod:`zoo.architectures.forward_order`).  Full references are in
``docs/references.md``.
"""
from ._common import ACTIVATIONS
from .cnn import SmallCNN
from .forward_order import output_modules, parametrised_modules_in_forward_order
from .lstm import MultiLSTM, UnrolledLSTM
from .mlp import MLP, LeNet300100
from .registry import ARCHITECTURES, Architecture, build_architecture, register_architecture, registered_architecture
from .transformer import FeedForward, SelfAttention, TransformerClassifier

__all__ = [
    "ACTIVATIONS",
    "MLP",
    "LeNet300100",
    "UnrolledLSTM",
    "MultiLSTM",
    "SmallCNN",
    "FeedForward",
    "SelfAttention",
    "TransformerClassifier",
    "Architecture",
    "ARCHITECTURES",
    "register_architecture",
    "registered_architecture",
    "build_architecture",
    "parametrised_modules_in_forward_order",
    "output_modules",
]
