"""One run: a :class:`~lab.runs.spec.RunSpec` resolved once, fitted, evaluated and written as a run folder.

* :mod:`lab.runs.spec` — what defines a run (:class:`~lab.runs.spec.RunSpec`), its checks, and
  :class:`~lab.runs.spec.ResolvedRun`: the spec resolved once on its data (likelihood, backend options);
* :mod:`lab.runs.model` — the run's Bayesian network;
* :mod:`lab.runs.features` — a frozen body's features (data of last-layer runs on a trained network);
* :mod:`lab.runs.evaluation` — the posterior's test-set prediction, metrics and ArviZ exports;
* :mod:`lab.runs.execution` — :func:`~lab.runs.execution.execute` (spec → result) and
  :func:`~lab.runs.execution.write_run`;
* the store of run folders: :mod:`lab.runs.store` (written aside, renamed into place),
  :mod:`lab.runs.check` (manifests and verification), :mod:`lab.runs.locks` (one writer per folder),
  :mod:`lab.runs.isolated` (NetCDF writes in a forked child).
"""
