"""Grids of runs: the named experiments of ``python -m zoo experiment NAME``, how they run and their tables.

* :mod:`lab.grids.registry` — :data:`~lab.grids.registry.EXPERIMENTS` and
  :func:`~lab.grids.registry.register_experiment` (the recipe for a new grid: ``docs/architecture.md``);
* :mod:`lab.grids.experiment` — what a grid is made of (:class:`~lab.grids.experiment.GridRun`,
  :class:`~lab.grids.experiment.Experiment`, dataset builders, extra metrics);
* the definitions: :mod:`lab.grids.papers` (Euler, structured, sparse VD, Radial), :mod:`lab.grids.uci`
  (the UCI protocol), :mod:`lab.grids.shift` (rotation, OOD, gap), :mod:`lab.grids.fidelity` (against
  reference posteriors), :mod:`lab.grids.smoke` (seconds-long grids for tests);
* running them: :mod:`lab.grids.runner` (the ``experiment`` command), :mod:`lab.grids.batches` (runs fitted
  together as one stacked program), :mod:`lab.grids.executors` (scheduling on local workers or Ray;
  the pools and Ray start-up are :mod:`inference.workers`'), :mod:`lab.grids.worker` (one run in a worker);
* results: :mod:`lab.grids.tables`, :mod:`lab.grids.plotting`.
"""
