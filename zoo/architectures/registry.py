"""The one architecture registry: :data:`ARCHITECTURES`, :func:`register_architecture`, :func:`build_architecture`.

Each :class:`Architecture` entry holds everything the library needs of a network family, so that
adding one is a single :func:`register_architecture` call:

* ``build`` — the constructor by name (:func:`build_architecture`; the CLI's ``--model`` and a run's
  ``RunSpec.model`` go through it, :mod:`lab.runs.model`);
* ``cls`` and ``describe`` — the arguments that rebuild an instance, which a saved posterior stores
  as its network's spec (:mod:`inference.storage.net_spec`);
* ``per_target`` and ``vmap_options`` — how a run sizes it (one branch per target) and the options
  that make it vmap over parameter sets when weights before its output layer are random;
* ``hidden_help`` — what ``hidden=`` (``--hidden``) means for it, listed by the CLI.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import nn

from .cnn import SmallCNN
from .lstm import MultiLSTM
from .mlp import MLP, LeNet300100
from .transformer import TransformerClassifier

__all__ = ["Architecture", "ARCHITECTURES", "register_architecture", "registered_architecture", "build_architecture"]


@dataclass(frozen=True)
class Architecture:
    """One registered architecture.

    Attributes:
        name: the name of :func:`build_architecture`, ``--model`` and ``RunSpec.model``.
        build: ``build(input_dim, output_dim, hidden=None, activation=None, **kw) -> nn.Module``
            (``**kw`` holds ``heads`` when ``per_target``).
        cls: the exact class of the networks ``build`` returns: its instances are described by
            ``describe`` when a posterior is saved (the first entry registered for a class does).
        describe: ``describe(net) -> dict | None``: the :func:`build_architecture` arguments
            (``input_dim``, ``output_dim`` and keywords; JSON values) that rebuild ``net``, or
            ``None`` when it cannot be rebuilt by name (then it is saved as a user network).
        per_target: one branch per target: ``build`` takes ``heads`` (outputs per target).
        vmap_options: keywords that make the network vmap over a leading batch of parameter
            sets, applied by a run whose random weights are not only the output layer's.
        hidden_help: what ``hidden=`` means for this architecture and its default.
    """

    name: str
    build: Callable[..., nn.Module]
    cls: type
    describe: Callable[[nn.Module], Optional[dict]]
    per_target: bool = False
    vmap_options: dict = field(default_factory=dict)
    hidden_help: str = ""


ARCHITECTURES: dict[str, Architecture] = {}
"""Registered architectures by name (:func:`register_architecture`)."""


def register_architecture(entry: Architecture) -> Architecture:
    """Add ``entry`` to :data:`ARCHITECTURES`; ``ValueError`` if its name is taken.  Returns it."""
    if entry.name in ARCHITECTURES:
        raise ValueError(f"architecture {entry.name!r} is already registered")
    ARCHITECTURES[entry.name] = entry
    return entry


def registered_architecture(cls: type) -> Optional[Architecture]:
    """The first entry registered for exactly ``cls`` (not a subclass), or ``None``."""
    return next((entry for entry in ARCHITECTURES.values() if entry.cls is cls), None)


def _no_option(name: str, option: str, value) -> None:
    if value is not None:
        raise ValueError(f"architecture {name!r} does not take {option}={value!r}")


def _dropout(net) -> dict:
    rate = getattr(net, "dropout", 0.0)
    return {"dropout": rate} if rate else {}


def _build_mlp(input_dim, output_dim, hidden=None, activation=None, **kw) -> nn.Module:
    return MLP(input_dim, output_dim, hidden=(50,) if hidden is None else hidden, activation=activation or "relu", **kw)


def _describe_mlp(net: MLP) -> Optional[dict]:
    if not isinstance(net.activation, str):
        return None
    return {"input_dim": net.input_dim, "output_dim": net.output_dim, "hidden": list(net.hidden),
            "activation": net.activation, **_dropout(net)}


def _build_lenet(input_dim, output_dim, hidden=None, activation=None, **kw) -> nn.Module:
    if hidden is not None and tuple([hidden] if isinstance(hidden, int) else hidden) != (300, 100):
        raise ValueError(f"lenet300100 has hidden widths (300, 100); got hidden={hidden!r} (use 'mlp' instead)")
    return LeNet300100(784 if input_dim is None else input_dim, 10 if output_dim is None else output_dim,
                       activation=activation or "relu", **kw)


def _describe_lenet(net: LeNet300100) -> Optional[dict]:
    if not isinstance(net.activation, str):
        return None
    return {"input_dim": net.input_dim, "output_dim": net.output_dim, "activation": net.activation, **_dropout(net)}


def _build_multilstm(input_dim, output_dim, hidden=None, activation=None, heads=1, **kw) -> nn.Module:
    _no_option("multilstm", "activation", activation)
    if hidden is not None and not isinstance(hidden, int):
        hidden = tuple(hidden)
        if len(hidden) != 1:
            raise ValueError(f"multilstm takes one hidden size (LSTM width), got hidden={hidden!r}")
        hidden = hidden[0]
    targets = 3 if output_dim is None else output_dim // heads
    if "names" not in kw and targets != 3:
        kw["names"] = tuple(f"y{i}" for i in range(targets))
    return MultiLSTM(
        input_size=3 if input_dim is None else input_dim,
        hidden_size=64 if hidden is None else hidden,
        n_outputs=targets * heads if output_dim is None else output_dim,
        heads=heads,
        **kw,
    )


def _describe_multilstm(net: MultiLSTM) -> dict:
    heads = {"heads": net.heads} if net.heads != 1 else {}
    return {"input_dim": net.input_size, "output_dim": len(net.names) * net.heads, "hidden": net.hidden_size,
            "names": list(net.names), "unrolled": net.unrolled, **heads}


def _build_cnn(input_dim, output_dim, hidden=None, activation=None, **kw) -> nn.Module:
    _no_option("cnn", "hidden", hidden)
    _no_option("cnn", "activation", activation)
    in_channels = kw.pop("in_channels", None)
    image_size = kw.pop("image_size", None)
    if isinstance(input_dim, (tuple, list, torch.Size)):
        if len(input_dim) != 3 or input_dim[1] != input_dim[2]:
            raise ValueError(f"cnn input_dim must be (C, S, S) or C*S*S, got {tuple(input_dim)}")
        in_channels = in_channels or input_dim[0]
        image_size = image_size or input_dim[1]
    elif input_dim is not None:
        in_channels = in_channels or 1
        if image_size is None:
            image_size = math.isqrt(input_dim // in_channels)
        if in_channels * image_size * image_size != input_dim:
            raise ValueError(
                f"cnn: input_dim={input_dim} is not in_channels*S*S for in_channels={in_channels}; "
                "pass in_channels= and image_size="
            )
    return SmallCNN(
        in_channels=in_channels or 1,
        image_size=image_size or 28,
        num_classes=10 if output_dim is None else output_dim,
        **kw,
    )


def _describe_cnn(net: SmallCNN) -> dict:
    return {"input_dim": [net.in_channels, net.image_size, net.image_size], "output_dim": net.num_classes}


def _build_transformer(input_dim, output_dim, hidden=None, activation=None, **kw) -> nn.Module:
    _no_option("transformer", "activation", activation)
    if hidden is not None:
        hidden = (hidden,) if isinstance(hidden, int) else tuple(hidden)
        if len(hidden) != 1:
            raise ValueError(f"transformer takes one hidden size (the FFN width d_ff), got hidden={hidden!r}")
        kw.setdefault("d_ff", hidden[0])
    vocab_size = kw.pop("vocab_size", None)
    token_dim = kw.pop("token_dim", None)
    if vocab_size is None:
        kw["input_dim"] = token_dim or kw.get("input_dim") or input_dim
    return TransformerClassifier(vocab_size, 2 if output_dim is None else output_dim, **kw)


def _describe_transformer(net: TransformerClassifier) -> dict:
    return {
        "input_dim": net.input_dim, "output_dim": net.num_classes, "vocab_size": net.vocab_size,
        "d_model": net.head.in_features, "n_heads": net.attention.num_heads, "d_ff": net.ffn.fc1.out_features,
        "max_len": net.max_len, "pooling": net.pooling, "padding_idx": net.padding_idx,
    }


register_architecture(Architecture("mlp", _build_mlp, MLP, _describe_mlp,
                                   hidden_help="hidden widths (default one layer of 50)"))
register_architecture(Architecture("lenet300100", _build_lenet, LeNet300100, _describe_lenet,
                                   hidden_help="only (300, 100)"))
register_architecture(Architecture("multilstm", _build_multilstm, MultiLSTM, _describe_multilstm, per_target=True,
                                   vmap_options={"unrolled": True}, hidden_help="LSTM width (default 64)"))
register_architecture(Architecture("cnn", _build_cnn, SmallCNN, _describe_cnn, hidden_help="none"))
register_architecture(Architecture("transformer", _build_transformer, TransformerClassifier, _describe_transformer,
                                   hidden_help="FFN width d_ff"))


def build_architecture(
    name: str,
    input_dim,
    output_dim: Optional[int],
    hidden=None,
    activation: Optional[str] = None,
    heads: int = 1,
    **kw,
) -> nn.Module:
    """Build an architecture of :data:`ARCHITECTURES` by name.

    Args:
        name: ``mlp`` | ``lenet300100`` | ``multilstm`` | ``cnn`` | ``transformer`` | a registered one.
        input_dim: ``mlp``/``lenet300100``: number of input features; ``multilstm``:
            features per time step; ``cnn``: ``C*S*S`` (``C = in_channels``, default 1) or
            ``(C, S, S)``; ``transformer``: features per time step of real-valued sequences
            (ignored when ``vocab_size=`` is given; ``token_dim=`` overrides it, e.g.
            ``input_dim=64, token_dim=8`` reads 8x8 digits as 8 rows of 8 pixels).
        output_dim: outputs / classes (all of them: ``heads`` per target).
        hidden: ``mlp``: hidden widths (default one layer of 50 units, the UCI standard);
            ``multilstm``: LSTM width (default 64); ``transformer``: FFN width ``d_ff``;
            ``lenet300100`` only accepts ``(300, 100)``; ``cnn`` accepts none.
        activation: ``mlp`` / ``lenet300100`` only (default ``"relu"``).
        heads: network outputs per target (a likelihood's ``heads``, e.g. 2 for a mean and a
            log-variance).  An architecture with one branch per target (``per_target``:
            ``multilstm``) builds ``output_dim / heads`` branches of ``heads`` outputs each; the
            others end in one dense layer, whose ``output_dim`` outputs serve any layout.
        **kw: passed to the class (e.g. ``vocab_size=``, ``d_model=``, ``unrolled=``,
            ``image_size=``; ``mlp`` / ``lenet300100``: ``dropout=`` rate in [0, 1), default 0).

    Raises:
        ValueError: unknown name (listing the valid ones) or an option the architecture
            does not take, or ``heads`` that is not a positive divisor of ``output_dim``.
    """
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; valid architectures: {', '.join(ARCHITECTURES)}")
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1 or (output_dim or heads) % heads:
        raise ValueError(f"heads (outputs per target) must be a positive divisor of output_dim={output_dim}, "
                         f"got heads={heads!r}")
    entry = ARCHITECTURES[name]
    if entry.per_target:
        kw["heads"] = heads
    return entry.build(input_dim, output_dim, hidden=hidden, activation=activation, **kw)
