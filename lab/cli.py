"""Command line: ``python -m zoo COMMAND ...`` (also ``python -m lab``).

``COMMANDS`` is the explicit table name → (add_arguments, run, help) of ``fit`` (here),
``experiment`` (:mod:`lab.grids.runner`) and ``report`` (:mod:`lab.report`).  Every argument, option
and the output path are validated before any fitting: bad ones exit with status 2 and a one-line
reason on stderr (so does ``--out`` at an existing run without ``--overwrite``, or an experiment
folder another process is using).  A fit whose posterior is unusable (:class:`lab.runs.evaluation.RunFailed`,
non-finite losses, or with ``--strict`` a fit flagged ``failed_fit``) exits with 1, Ctrl-C with 130
and SIGTERM with 143, each with one line; an interrupted fit leaves the output path as it was (see
:mod:`lab.runs.store`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import signal
import sys
import textwrap
import threading
from typing import Callable

import torch

from inference.backends import BACKENDS, NonFiniteLossError
from inference.mcmc.budget import TimeBudgetExceeded
from inference.variational.pruning import PRUNE_MODES
from zoo.architectures import ARCHITECTURES
from zoo.data import DATASET_SPECS
from zoo.likelihoods import LIKELIHOODS
from zoo.priors import PRIORS
from zoo.stochastic import SELECTOR_NAMES

from lab.grids.runner import add_experiment_arguments, run_experiment_command
from lab.references.fidelity import add_fidelity_arguments, run_fidelity_command
from lab.references.cli import add_reference_arguments, run_reference_command
from .report import add_report_arguments, run_report_command, write_report
from lab.runs.evaluation import RunFailed
from lab.runs.spec import RunSpec
from lab.runs.execution import execute
from lab.runs.store import WriteError, interrupted, note_interrupt

__all__ = ["main", "COMMANDS", "build_parser"]

#: CLI flag → backend option name (passed when given)
BACKEND_FLAGS = {
    "chains": "num_chains",
    "warmup": "warmup_steps",
    "thin": "thin",
    "step_size": "step_size",
    "mc_kl_samples": "mc_kl_samples",
}


def _count(text: str) -> int:
    """An integer argument; ``1e3`` is read as 1000 (sizes beyond what can run are refused later, with an estimate)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value == int(value)):
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}")
    return int(value)


def _positive_int(text: str) -> int:
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = _count(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {value}")
    return value


#: ``fit --help`` examples
FIT_EXAMPLES = (
    "python -m zoo fit --data toy1d --backend svi --epochs 200 --out runs/toy-svi",
    "python -m zoo fit --data uci:yacht --stochastic last --backend nuts --chains 4 --option max_tree_depth=8 "
    "--out runs/yacht-nuts",
    "python -m zoo fit --data moons --backend mc-dropout --option dropout=0.1 --device cuda --out runs/moons-mcd",
)


def _option_default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return "(required)"


def backend_options_help(width: int = 100) -> str:
    """Every backend's options with their defaults, one wrapped paragraph per backend (``fit --help``)."""
    blocks = []
    for name, engine in BACKENDS.items():
        fields = dataclasses.fields(engine.Config) if dataclasses.is_dataclass(engine.Config) else ()
        listing = ", ".join(f"{f.name}={_option_default(f)!r}" for f in fields) or "(no options)"
        blocks.append(textwrap.fill(listing, width, initial_indent=f"  {name}: ", subsequent_indent="      "))
    return "\n".join(blocks)


def _add_fit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "backend options (name=default; set with --option NAME=VALUE or their own flags):\n"
        + backend_options_help() + "\n\nexamples:\n" + "\n".join(f"  {line}" for line in FIT_EXAMPLES)
    )
    data_help = "; ".join(f"{k}: {v}" for k, v in DATASET_SPECS.items())
    parser.add_argument("--data", required=True, help=f"dataset spec. {data_help}")
    parser.add_argument("--model", default="mlp", help=f"architecture: {', '.join(ARCHITECTURES)} (default mlp)")
    parser.add_argument(
        "--stochastic",
        default="all",
        help="which parameters are random: " + "; ".join(f"{k} ({v})" for k, v in SELECTOR_NAMES.items())
        + "; mean-head / last-mean-head (heteroscedastic: all / the output layer's mean rows random, the "
          "variance head deterministic)",
    )
    parser.add_argument("--backend", default="svi", help=f"inference backend: {', '.join(BACKENDS)} (default svi)")
    parser.add_argument("--split", type=int, default=0, help="UCI split index (default 0)")
    parser.add_argument("--seed", type=int, default=0, help="fixes every random draw of the run (default 0)")
    parser.add_argument("--epochs", type=_positive_int, help="training epochs (default: about 5000 steps)")
    parser.add_argument("--batch-size", type=_positive_int, help="minibatch size")
    parser.add_argument("--lr", type=float, help="learning rate")
    parser.add_argument("--num-samples", "--samples", dest="num_samples", type=_positive_int,
                        help="posterior draws (per chain for MCMC backends)")
    parser.add_argument("--pretrain-epochs", type=_non_negative_int,
                        help="deterministic pretraining epochs before VI (default epochs/4)")
    parser.add_argument("--hidden", type=_positive_int, nargs="+", help="hidden sizes: " + "; ".join(
        f"{name}: {entry.hidden_help}" for name, entry in ARCHITECTURES.items() if entry.hidden_help))
    parser.add_argument("--activation", help="hidden activation (relu, tanh, ...)")
    parser.add_argument("--prior", default="normal", help=f"weight prior: {', '.join(PRIORS)} (default normal)")
    parser.add_argument("--prior-scale", type=float, help="prior scale (default 1.0; pretrained: 0.5)")
    parser.add_argument("--noise", default="learned",
                        help="regression noise: 'learned' (Gamma prior on the precision) or a fixed sd in standardised units")
    parser.add_argument("--likelihood", choices=[n for n in LIKELIHOODS if LIKELIHOODS[n].task == "regression"],
                        help="regression likelihood: gaussian (default), heteroscedastic (the net also predicts a "
                             "log-variance), studentt (heavy tails); classification data use categorical")
    parser.add_argument("--beta", type=float,
                        help="heteroscedastic: beta of the beta-NLL training loss, in [0, 1] (default 0.5; 0 = plain "
                             "NLL; Seitzer et al. 2022)")
    parser.add_argument("--dof", help="studentt: degrees of freedom, 'learned' (Gamma(2, 0.1) prior; default) or a "
                                      "fixed number")
    parser.add_argument("--variance-link", choices=("log", "softplus"),
                        help="heteroscedastic: the variance head's link, log (log-variance; default) or softplus "
                             "(softplus + 1e-6, Lakshminarayanan et al. 2017)")
    parser.add_argument("--chains", type=_positive_int, help="MCMC chains")
    parser.add_argument("--warmup", type=_non_negative_int, help="MCMC warm-up / burn-in steps")
    parser.add_argument("--thin", type=_positive_int, help="keep every k-th draw")
    parser.add_argument("--step-size", type=float, help="(initial) sampler step size")
    parser.add_argument("--mc-kl-samples", type=_positive_int, help="Monte Carlo samples M of the Radial guide's KL")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="any other backend option, repeatable, e.g. --option max_tree_depth=8 "
                             "--option dense_mass=true (values are JSON: numbers, true/false, strings)")
    parser.add_argument("--prune", default="none", choices=PRUNE_MODES,
                        help="prune variational layers after fitting")
    parser.add_argument("--report", action="store_true", help="also write an HTML diagnostics report into --out")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"),
                        help="where to fit and predict (default cpu); an unavailable device exits with status 2 "
                             "before any work")
    parser.add_argument("--threads", type=_positive_int, default=1,
                        help="torch CPU threads (default 1: small BNNs are overhead-bound and extra threads "
                             "only help large layers)")
    parser.add_argument("--out", required=True,
                        help="run folder to write (metrics.json, config.json, posterior/, posterior.nc, train.nc, "
                             "COMPLETE); must not hold a run unless --overwrite")
    parser.add_argument("--overwrite", action="store_true", help="replace the run at --out (whole) if there is one")
    parser.add_argument("--strict", action="store_true",
                        help="a fit flagged failed_fit (worse than the trivial predictor in RMSE or test LL, or a "
                             "predictive scale beyond 10x the targets' range) exits with status 1 and writes nothing")


def spec_from_args(args) -> RunSpec:
    """The :class:`~lab.runs.spec.RunSpec` of parsed ``fit`` arguments (``--option`` values read as JSON)."""
    noise = args.noise if args.noise == "learned" else _float_arg("--noise", args.noise)
    options = {BACKEND_FLAGS[k]: getattr(args, k) for k in BACKEND_FLAGS if getattr(args, k) is not None}
    for key, value in (_option_arg(text) for text in args.option):
        if key in options:
            raise ValueError(f"--option {key}=... repeats a value already given (by its own flag or an earlier --option)")
        options[key] = value
    return RunSpec(
        data=args.data,
        model=args.model,
        stochastic=args.stochastic,
        backend=args.backend,
        split=args.split,
        seed=args.seed,
        hidden=args.hidden,
        activation=args.activation,
        prior=args.prior,
        prior_scale=args.prior_scale,
        noise=noise,
        likelihood=args.likelihood,
        likelihood_options=_likelihood_options(args),
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        num_samples=args.num_samples,
        pretrain_epochs=args.pretrain_epochs,
        prune=args.prune,
        backend_options=options,
    )


def _likelihood_options(args) -> dict:
    """``likelihood_options`` of ``--beta`` / ``--variance-link`` / ``--dof``, each checked to apply to
    ``--likelihood``."""
    flags = {"--beta": ("heteroscedastic", args.beta), "--variance-link": ("heteroscedastic", args.variance_link),
             "--dof": ("studentt", args.dof)}
    for flag, (owner, value) in flags.items():
        if value is not None and args.likelihood != owner:
            raise ValueError(f"{flag} applies to --likelihood {owner} only (got --likelihood {args.likelihood or 'gaussian'})")
    if args.beta is not None or args.variance_link is not None:
        return {**({"beta": args.beta} if args.beta is not None else {}),
                **({"variance": args.variance_link} if args.variance_link is not None else {})}
    if args.dof is not None and args.dof != "learned":
        return {"dof": _float_arg("--dof", args.dof), "learn_dof": False}
    return {}


def _option_arg(text: str) -> tuple:
    """``KEY=VALUE`` of ``--option``; VALUE is read as JSON (``8``, ``1e-3``, ``true``), else kept as a string."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--option takes KEY=VALUE (e.g. max_tree_depth=8), got {text!r}")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def _float_arg(flag, text):
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{flag} must be 'learned' or a number, got {text!r}") from None


SUMMARY_KEYS = ("rmse", "test_ll", "coverage_90", "accuracy", "nll", "ece", "sparsity", "rhat_max",
                "ess_bulk_min", "divergences", "tree_depth_saturated", "rmse_ratio", "test_ll_gain", "fit_seconds")


def _run_fit(args) -> int:
    torch.set_num_threads(args.threads)
    spec = spec_from_args(args)
    result = execute(spec, args.out, overwrite=args.overwrite, progress=not args.quiet, device=args.device,
                     strict=args.strict)
    metrics = result.metrics
    if args.report:
        print(f"wrote {write_report(result.directory)}")  # atomic: lab.runs.store.write_text_file
    rows = [(k, metrics[k]) for k in SUMMARY_KEYS if k in metrics]
    width = max(len(k) for k, _ in rows)
    print(f"{spec.data} · {spec.model} · stochastic={spec.stochastic} · backend={spec.backend} · split {spec.split} · seed {spec.seed}")
    for key, value in rows:
        print(f"  {key:<{width}}  {value:.4g}" if isinstance(value, float) else f"  {key:<{width}}  {value}")
    print(f"  wrote {result.directory}/: metrics.json, config.json, posterior/, posterior.nc, train.nc, COMPLETE")
    if metrics.get("failed_fit"):
        print(f"WARNING: failed fit (failed_fit: true in metrics.json): {metrics['failed_fit_reason']}")
    return 0


COMMANDS: dict[str, tuple[Callable, Callable, str]] = {
    "fit": (_add_fit_arguments, _run_fit, "fit one model on one dataset and write a run directory"),
    "experiment": (add_experiment_arguments, run_experiment_command,
                   "run a named experiment grid and write its result tables"),
    "report": (add_report_arguments, run_report_command,
               "write HTML posterior-diagnostics reports for run directories"),
    "reference": (add_reference_arguments, run_reference_command,
                  "list or build the reference posteriors (long multi-chain NUTS) that runs are scored against"),
    "fidelity": (add_fidelity_arguments, run_fidelity_command,
                 "score a run folder against a reference posterior (agreement / total variation or W2, noise "
                 "floor, reference coverage) and add the scores to its metrics.json"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m zoo",
        description="A Pyro model zoo of partially stochastic Bayesian neural networks.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (add_arguments, _, help_text) in COMMANDS.items():
        add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def run_command(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return COMMANDS[args.command][1](args)


#: what torch and CUDA say when an allocation fails
_OUT_OF_MEMORY = re.compile(r"can't allocate memory[^.]*|CUDA out of memory|Cannot allocate memory")


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so that it unwinds like Ctrl-C (temporary folders removed,
    workers stopped); a ``BaseException`` so that no ``except Exception`` takes it for a failed run."""


def _raise_terminated(signum, frame):
    raise _Terminated()


#: seconds a Ctrl-C may take to unwind before the process exits with 130 anyway
CTRL_C_GRACE_SECONDS = 10.0
_watchdogs: list = []


def _exit_interrupted():
    print("interrupted (Ctrl-C)", file=sys.stderr, flush=True)
    os._exit(130)


def _raise_interrupt(signum, frame):
    """Ctrl-C: ``KeyboardInterrupt`` as usual, plus a watchdog that ends the process with 130 if the
    interrupt is lost (Python swallows an exception raised inside a finaliser, e.g. a ``__del__``
    that the signal happened to land in; the fit would then run on).  Run folders stay whole: a run
    is written aside and renamed into place, and the next write removes a killed writer's leftovers."""
    note_interrupt()  # a swallowed interrupt still stops the write (lab.runs.store) and the exit status (main)
    watchdog = threading.Timer(CTRL_C_GRACE_SECONDS, _exit_interrupted)
    watchdog.daemon = True
    watchdog.start()
    _watchdogs.append(watchdog)
    raise KeyboardInterrupt


def main(argv=None) -> int:
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main_thread else None
    previous_int = signal.signal(signal.SIGINT, _raise_interrupt) if in_main_thread else None
    interrupted(clear=True)
    try:
        status = run_command(sys.argv[1:] if argv is None else argv)
        if interrupted():  # Ctrl-C swallowed on the way (e.g. raised inside a finaliser): never exit 0
            raise KeyboardInterrupt
        return status
    except (NonFiniteLossError, TimeBudgetExceeded, RunFailed, WriteError) as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, NotADirectoryError) as err:
        print(f"error: {str(err).splitlines()[0] if str(err) else type(err).__name__}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as err:  # past the estimate (inference.memory): one line, status 1
        reason = _OUT_OF_MEMORY.search(str(err))
        if reason is None and not isinstance(err, MemoryError):
            raise
        print(f"error: out of memory ({reason.group(0) if reason else type(err).__name__}): lower the sizes "
              f"(--hidden, --num-samples, --chains, members) or --batch-size; nothing was written", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C)", file=sys.stderr)
        # the stopped worker pools' exit hooks may still write to their closed wake-up pipes while the
        # interpreter shuts down (CPython 3.11's concurrent.futures): nothing of the run is left to report
        sys.unraisablehook = lambda unraisable: None
        return 130
    except _Terminated:
        print("terminated (SIGTERM)", file=sys.stderr)
        return 143
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)
        while _watchdogs:  # the interrupt unwound in time
            _watchdogs.pop().cancel()
