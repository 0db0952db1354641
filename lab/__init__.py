"""The application layer: command line, reproducible runs, experiment grids, reports.

Imports :mod:`zoo` (what) and :mod:`inference` (how); neither imports it.
"""
