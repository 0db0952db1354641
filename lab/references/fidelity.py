"""Score a run against a reference posterior: ``python -m zoo fidelity RUN_DIR --reference NAME``.

:func:`score_run` checks that the run fitted the reference's model on the reference's data — the
same network structure, random sites, prior and likelihood (:func:`lab.references.problems.model_signature`)
and the same training data (:meth:`zoo.data.Dataset.fingerprint`, recorded in the run's
``config.json``; a run written before the fingerprint existed is matched by reloading its data from
its spec) — then predicts the run's posterior at the reference's test points (seeded by the run's
seed) and scores it with :mod:`inference.evaluation.fidelity` against the reference (half ``a``):
``agreement``, ``total_variation`` (classification) or ``w2`` (regression), and
``reference_coverage_90``, beside the ``noise_floor`` of each (half ``b`` scored against ``a``, stored
with the reference) and the ratio of each distance to its floor.

:func:`write_fidelity` stores the record in the run's ``metrics.json`` — under ``fidelity`` keyed by
reference name, and as flat ``fidelity_*`` columns for the experiment tables — keeping the run
complete: the run is rewritten aside with the new file, sealed and swapped in whole
(:func:`lab.runs.store.replace_run_file`), under a lock on the run's parent folder.
:func:`matching_reference` finds a built reference for a run's data and network, so that
:func:`lab.runs.execution.execute` scores every run that has one.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from inference import load_posterior
from inference.evaluation.fidelity import classification_fidelity, regression_fidelity
from zoo.data import load_dataset

from .problems import model_signature, problem_data
from .build import MANIFEST, Reference, load_reference, references_root
from lab.runs.check import StoreError, verify_run
from lab.runs.store import RunLock, replace_run_file

__all__ = ["score_prediction", "score_run", "write_fidelity", "matching_reference", "flat_columns",
           "add_fidelity_arguments", "run_fidelity_command", "DISTANCES"]

#: the distance metrics per task (each has a noise floor and a ratio to it)
DISTANCES = {"classification": ("agreement", "total_variation"), "regression": ("w2",)}
_RUN_FILES = ("metrics.json", "config.json", "posterior")


def score_prediction(reference: Reference, prediction) -> dict:
    """The fidelity record of a :class:`~inference.prediction.Prediction` at ``reference.x_test``."""
    floor = reference.manifest["noise_floor"]
    if reference.task == "classification":
        scores = classification_fidelity(prediction.probs, reference.prob_draws())
    else:
        scores = regression_fidelity(prediction.mixture, reference.mixture())
    distances = DISTANCES[reference.task]
    ratio = {}
    for key in distances:  # agreement is a similarity: its "distance" is 1 − agreement
        gap, floor_gap = (1 - scores[key], 1 - floor[key]) if key == "agreement" else (scores[key], floor[key])
        ratio[key] = gap / floor_gap if floor_gap > 0 else None  # a floor of 0 resolves nothing: no ratio
    return {"reference": reference.name, "task": reference.task, **scores,
            "noise_floor": {k: floor[k] for k in scores}, "ratio_to_noise_floor": ratio,
            "num_draws": int(prediction.num_samples), "reference_draws": _reference_draws(reference),
            "reference_meets_targets": bool(reference.manifest["meets_targets"]),
            "reference_rhat_max": reference.manifest["rhat_max"],
            "reference_ess_bulk_min": reference.manifest["ess_bulk_min"]}


def _reference_draws(reference: Reference) -> int:
    diagnostics = reference.manifest["diagnostics"]["a"]
    return int(diagnostics["chains"] * diagnostics["draws"])


def _check_same_model(reference: Reference, posterior) -> None:
    expected, found = reference.manifest["model"], model_signature(posterior.bnn)
    differ = [key for key in expected if expected[key] != found.get(key)]
    if differ:
        key = differ[0]
        raise ValueError(f"the run's model differs from reference {reference.name}'s in its {key} "
                         f"({_short(found.get(key))} against {_short(expected[key])}): fit "
                         f"{reference.problem.description} to compare with it")


def _short(value) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= 120 else text[:117] + "..."


def _run_fingerprint(run_dir: Path, config: dict) -> Optional[str]:
    data = config.get("data") or {}
    if isinstance(data.get("fingerprint"), str):
        return data["fingerprint"]
    spec = config.get("spec") or {}
    try:  # a run written before runs recorded the fingerprint: its data again, from its spec
        return load_dataset(spec["data"], split=spec.get("split", 0), seed=spec.get("seed", 0),
                            **(spec.get("data_options") or {})).fingerprint()
    except (KeyError, TypeError, ValueError, OSError):
        return None


def _check_same_data(reference: Reference, run_dir: Path, config: dict) -> None:
    found = _run_fingerprint(run_dir, config)
    expected = {reference.manifest["data"]["fingerprint"]}
    if found not in expected:  # the reference's data computed here (a frozen body's features, float rounding)
        expected.add(problem_data(reference.problem, reference.body()).fingerprint())
    if found not in expected:
        spec = config.get("spec") or {}
        problem = reference.problem
        raise ValueError(f"the run was fitted on other training data ({spec.get('data')}, split {spec.get('split')}, "
                         f"seed {spec.get('seed')}) than reference {reference.name} ({problem.spec.data}, split "
                         f"{problem.spec.split}, data seed {problem.data_seed}"
                         f"{', the frozen body features' if problem.frozen_body else ''})")


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise StoreError(f"{path} is unreadable ({type(err).__name__})") from None
    if not isinstance(value, dict):
        raise StoreError(f"{path} does not hold a JSON object")
    return value


def score_run(run_dir, reference) -> dict:
    """The fidelity record of the run in ``run_dir`` against ``reference`` (a :class:`Reference`, a name or a
    folder); ``ValueError`` for a damaged run, a missing reference, or another model or data."""
    run_dir = Path(run_dir)
    verify_run(run_dir, _RUN_FILES)
    reference = reference if isinstance(reference, Reference) else load_reference(reference)
    config = _read_json(run_dir / "config.json")
    posterior = load_posterior(run_dir / "posterior")
    _check_same_model(reference, posterior)
    _check_same_data(reference, run_dir, config)
    seed = (config.get("spec") or {}).get("seed", 0)
    seed = seed if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0 else 0
    prediction = posterior.predict(reference.x_test.to(posterior.bnn.target_scale.device), seed=seed)
    return score_prediction(reference, prediction)


def flat_columns(record: dict) -> dict:
    """The scalar ``metrics.json`` columns of a fidelity record (what experiment tables read)."""
    out = {"fidelity_reference": record["reference"]}
    for key in DISTANCES[record["task"]]:
        out[f"fidelity_{key}"] = record[key]
        out[f"fidelity_{key}_noise_floor"] = record["noise_floor"][key]
        out[f"fidelity_{key}_ratio"] = record["ratio_to_noise_floor"][key]
    out["reference_coverage_90"] = record["reference_coverage_90"]
    return out


def write_fidelity(run_dir, record: dict) -> dict:
    """Add ``record`` to the run's ``metrics.json`` (``fidelity[NAME]`` and :func:`flat_columns`), atomically;
    returns the new metrics."""
    run_dir = Path(run_dir).absolute()
    with RunLock(run_dir.parent):
        verify_run(run_dir, _RUN_FILES)
        metrics = _read_json(run_dir / "metrics.json")
        fidelity = metrics.get("fidelity") if isinstance(metrics.get("fidelity"), dict) else {}
        metrics["fidelity"] = {**fidelity, record["reference"]: record}
        metrics.update(flat_columns(record))
        replace_run_file(run_dir, "metrics.json", json.dumps(metrics, indent=2, default=_jsonable))
    return metrics


def _jsonable(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def matching_reference(fingerprint: str, bnn, root=None) -> Optional[Reference]:
    """A built reference (in ``root``, default :func:`lab.references.build.references_root`) for data with this
    fingerprint and this network's model, or ``None``.  Manifests are compared first; only a match is
    loaded (and verified)."""
    root = Path(root) if root is not None else references_root()
    if not root.is_dir():
        return None
    signature = None
    for manifest_path in sorted(root.glob(f"*/{MANIFEST}")):
        try:
            manifest = json.loads(manifest_path.read_text())
            if manifest["data"]["fingerprint"] != fingerprint:
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue
        signature = signature or model_signature(bnn)
        if manifest.get("model") != signature:
            continue
        try:
            return load_reference(manifest_path.parent)
        except ValueError:
            continue
    return None


# ------------------------------------------------------------------ CLI
def add_fidelity_arguments(parser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (python -m zoo fit --out)")
    parser.add_argument("--reference", required=True, metavar="NAME",
                        help="a reference name (python -m zoo reference list; looked up in $BNN_ZOO_REFERENCES or "
                             "~/.cache/bnn-zoo/references) or a reference folder")
    parser.add_argument("--no-write", action="store_true", help="print the scores without adding them to metrics.json")


def run_fidelity_command(args) -> int:
    torch.set_num_threads(1)
    record = score_run(args.run_dir, args.reference)
    if not args.no_write:
        write_fidelity(args.run_dir, record)
    print(json.dumps(record, default=_jsonable))
    return 0
