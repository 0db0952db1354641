"""The application layer: command line, reproducible runs, experiment grids, reports.

Imports :mod:`zoo` (what) and :mod:`inference` (how); neither imports it.
"""
import sys as _sys

if "-m" in _sys.orig_argv[:-1] and _sys.orig_argv[_sys.orig_argv.index("-m") + 1] == __name__:
    # ``python -m lab`` is starting: a Ctrl-C during the seconds of imports (torch, pyro, arviz) exits 130
    # with one line, not a traceback or a C++ abort; lab.cli.main installs its own handler once it runs
    import os as _os
    import signal as _signal

    _signal.signal(_signal.SIGINT, lambda signum, frame: (_sys.stderr.write("interrupted (Ctrl-C)\n"),
                                                          _os._exit(130)))
