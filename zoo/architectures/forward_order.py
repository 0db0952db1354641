"""Which modules of a network are "last": forward order of the parametrised modules.

:func:`parametrised_modules_in_forward_order` records the order in which modules that own
parameters run on an example input; :func:`output_modules` picks the last one (or the
modules a multi-head network names in ``last_layer_names``), which the ``last``
stochastic selector (:class:`zoo.stochastic.LastLayer`) makes random.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["parametrised_modules_in_forward_order", "output_modules"]


def _owners(module: nn.Module) -> list[str]:
    """Names of the modules owning parameters directly (``""`` for the root), registration order."""
    return [name for name, m in module.named_modules() if next(m.parameters(recurse=False), None) is not None]


def parametrised_modules_in_forward_order(module: nn.Module, example_input) -> list[str]:
    """Names of the modules that own parameters, in the order their forward hooks fire.

    A module "owns" parameters when it has parameters of its own (not only through
    children): leaf layers, but also e.g. an attention module's ``in_proj_weight``.  A
    forward hook fires when a module's forward *returns*, so a parent owner comes after its
    children; a module called twice is listed at its first call; a parametrised module whose
    forward is never called but whose parent's is (e.g. a weight read directly by the parent)
    is listed right before that parent.  Owners never reached by the forward pass are left
    out.  The root module is listed as ``""`` if it owns parameters.

    Args:
        module: the network (its train/eval mode is left as is; runs under ``no_grad``).
        example_input: a tensor (or a tuple of positional arguments) to run the forward on.
    """
    owners = set(_owners(module))
    fired: list[str] = []
    seen: set[str] = set()
    called: set[str] = set()
    names = {id(m): n for n, m in module.named_modules()}

    def hook(mod, _inputs, _output):
        name = names[id(mod)]
        called.add(name)
        if name in seen:
            return
        prefix = f"{name}." if name else ""
        # owners below this module that never ran themselves (their weights were used directly)
        for child in sorted(owners):
            if child != name and child.startswith(prefix) and child not in seen and child not in called:
                fired.append(child)
                seen.add(child)
        if name in owners:
            fired.append(name)
            seen.add(name)

    handles = [m.register_forward_hook(hook) for m in module.modules()]
    args = example_input if isinstance(example_input, tuple) else (example_input,)
    try:
        with torch.no_grad():
            module(*args)
    finally:
        for h in handles:
            h.remove()
    return fired


def output_modules(module: nn.Module, example_input=None) -> tuple[str, ...]:
    """The "last" parametrised module(s) of a network (for the ``last`` selector).

    If the network has a ``last_layer_names`` attribute (a multi-head net such as
    :class:`MultiLSTM`: all heads are fed by the final concatenation) those names are
    returned; otherwise the last entry of :func:`parametrised_modules_in_forward_order` on
    ``example_input`` (e.g. ``("out",)`` for an :class:`MLP`).

    Raises:
        ValueError: ``last_layer_names`` names an unknown module, the forward order is
            needed but ``example_input`` is missing, or nothing parametrised ran.
    """
    names = getattr(module, "last_layer_names", None)
    if names is not None:
        names = (names,) if isinstance(names, str) else tuple(names)
        known = dict(module.named_modules())
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"last_layer_names lists unknown modules {unknown}; modules: {', '.join(n for n in known if n)}")
        return names
    if example_input is None:
        raise ValueError(
            f"{type(module).__name__} has no last_layer_names attribute: pass example_input so the "
            "forward order can decide which module is last"
        )
    order = parametrised_modules_in_forward_order(module, example_input)
    if not order:
        raise ValueError(f"no parametrised module of {type(module).__name__} ran on the example input")
    return (order[-1],)
