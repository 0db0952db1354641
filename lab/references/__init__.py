"""Reference posteriors (long multi-chain NUTS) and the fidelity of a run to them.

* :mod:`lab.references.problems` — the reference problems (data, network, prior);
* :mod:`lab.references.build` — building, saving and loading a reference;
* :mod:`lab.references.diagnostics` — its predictive diagnostics;
* :mod:`lab.references.fidelity` — scoring a run against a reference (the ``fidelity`` command);
* :mod:`lab.references.cli` — the ``reference`` command.
"""
