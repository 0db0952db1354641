"""Reference posteriors: long multi-chain NUTS or tempered SMC on a problem of :mod:`lab.references.problems`, stored as data.

``python -m zoo reference build NAME [--out DIR]`` runs :func:`build_reference`: two independent
*halves* (``a``, the reference, and ``b``, its twin for the noise floor), each of
``problem.fits`` fits with their own seeds over the problem's model — NUTS fits (own initial weights, MAP start,
adaptation and chains), or for ``method="smc"`` independent tempered SMC runs (:func:`inference.smc.smc_posterior`:
own prior draws, resampling and moves; each run's ``N`` equally weighted particles, in a random order, are one
"chain" of the diagnostics, so R-hat and ESS across the runs measure whether independent runs agree, on the
weights of the modes too) — over the problem's model (:func:`lab.references.problems.problem_model`, the same
``BayesianNetwork`` the backends fit; the noise precision a latent), with the problem's explicit
sampler settings.  Stored are the *predictive* draws of every kept iteration at the test points
and the plotting grid: per draw the predictive mixture's component (location and noise scale,
original units) for regression, the class probabilities for classification — not the weights.
The diagnostics are computed on exactly those stored quantities (rank-normalised split R-hat and
bulk / tail ESS of Vehtari et al. 2021 over the chains of a half), the targets are R-hat ≤ 1.01
and bulk ESS ≥ 1000 on every one, and the half ``b`` scored against ``a`` with
:mod:`inference.evaluation.fidelity` is the noise floor of every metric.

A reference folder is written like a run (:func:`lab.runs.store.staged_directory`: aside, sealed with
``COMPLETE``, renamed into place) and holds ``reference.json`` (the manifest: problem, prior,
likelihood, seeds, settings, package versions, diagnostics, noise floor, timings) and
``draws.npz`` (float32 arrays, read with ``allow_pickle=False``: no pickle).  :func:`load_reference`
re-checks the seal and every array's name and shape against the manifest before use.
References are built on demand into :func:`references_root` (``$BNN_ZOO_REFERENCES``, else
``~/.cache/bnn-zoo/references``), not shipped: a few MB each, tens of minutes to build.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from inference.evaluation.fidelity import classification_fidelity, regression_fidelity
from inference.fitting import fit
from inference.smc import SMCConfig, smc_posterior
from zoo.likelihoods import PredictiveMixture

from .problems import (PROBLEMS, TINY, TINY_SMC, ReferenceProblem, data_fingerprint, get_problem, model_signature,
                                 plot_grid, problem_data, problem_model, train_body)
from .diagnostics import predictive_diagnostics
from lab.runs.check import StoreError, verify_run
from lab.runs.store import staged_directory

__all__ = ["Reference", "build_reference", "load_reference", "references_root", "reference_path", "FORMAT",
           "RHAT_TARGET", "ESS_TARGET", "HALVES", "SEED_BASE"]

FORMAT = "bnn-zoo-reference/1"
RHAT_TARGET, ESS_TARGET = 1.01, 1000.0
#: the two independent halves: ``a`` is the reference, ``b`` its twin for the noise floor
HALVES = ("a", "b")
#: fit ``i`` of half ``h`` has seed ``SEED_BASE[h] + i``
SEED_BASE = {"a": 1000, "b": 2000}
MANIFEST, ARRAYS = "reference.json", "draws.npz"
_MAX_MANIFEST = 4 << 20


def references_root() -> Path:
    """Where references are built and looked up by name: ``$BNN_ZOO_REFERENCES`` or ``~/.cache/bnn-zoo/references``."""
    root = os.environ.get("BNN_ZOO_REFERENCES")
    return Path(root) if root else Path.home() / ".cache" / "bnn-zoo" / "references"


def reference_path(name_or_path) -> Path:
    """A reference folder: ``references_root() / NAME`` for a problem name, else ``name_or_path`` as a folder
    path (anything with a path separator, or an existing folder); a ``ValueError`` lists the valid names."""
    text = str(name_or_path)
    if text in PROBLEMS and os.sep not in text:
        return references_root() / text
    if os.sep in text or Path(text).is_dir():
        return Path(text)
    get_problem(text)  # a ValueError listing the valid names
    return references_root() / text


# ------------------------------------------------------------------ build
def _versions() -> dict:
    import arviz
    import pyro

    import zoo

    return {"bnn-zoo": zoo.__version__, "torch": torch.__version__, "pyro": pyro.__version__,
            "arviz": arviz.__version__, "numpy": np.__version__, "python": platform.python_version()}


def _predictive_arrays(posterior, x: torch.Tensor, seed: int) -> dict:
    """``{quantity: [C, S, ...] float32}``: every draw's predictive at ``x`` (the chains kept apart)."""
    chains = posterior.num_chains
    prediction = posterior.predict(x, seed=seed)
    if prediction.task == "classification":
        return {"probs": prediction.probs.reshape(chains, -1, *prediction.probs.shape[1:]).float().numpy()}
    mixture = prediction.mixture
    if mixture.df is not None:
        raise ValueError("references store Gaussian predictive mixtures; a Student-t likelihood is not supported")
    loc = mixture.loc.reshape(chains, -1, *mixture.loc.shape[1:])
    scale = mixture.scale.expand(len(mixture.loc), *mixture.scale.shape[1:]).reshape(chains, -1, *mixture.scale.shape[1:])
    return {"loc": loc.float().numpy(), "scale": scale.float().numpy()}


def _fit_record(posterior, seconds: float) -> dict:
    info, stats = posterior.info, posterior.sample_stats
    if info.get("backend") == "smc":
        return {"seed": info["seed"], "seconds": seconds, "num_stages": info["num_stages"],
                # the ESS of the last stage's importance weights (before its resampling), of N particles
                "final_ess": info["final_ess"], "log_evidence": info["log_evidence"],
                "divergences": info["divergences"], "acceptance_mean": sum(info["acceptance"]) / len(info["acceptance"]),
                "acceptance_min": min(info["acceptance"]), "step_size_final": info["step_size"][-1],
                "num_random": info["num_random"], "betas": info["betas"]}
    return {"seed": info["seed"], "seconds": seconds, "divergences": info.get("divergences"),
            "warmup_divergences": info.get("warmup_divergences"),
            "tree_depth_saturated": info.get("tree_depth_saturated"),
            "tree_depth_mean": float(stats["tree_depth"].float().mean()) if "tree_depth" in stats else None,
            # log π of the kept draws per chain (one model, so comparable across fits: fits in different modes show)
            "log_density_mean": stats["lp"].double().mean(-1).tolist() if "lp" in stats else None,
            "step_size": info.get("step_size"), "num_random": info.get("num_random"), "metric": info.get("metric")}


def _fit(problem, bnn, data, sampler: dict, seed: int, progress: bool, desc: str):
    """One fit of the problem's sampler: the ``nuts`` backend, or one SMC run (draws ``[1, N, ...]``)."""
    if problem.method == "smc":
        return smc_posterior(bnn, data.x_train, data.y_train, SMCConfig(**sampler), seed, progress, desc=desc)
    return fit(bnn, data.x_train, data.y_train, backend="nuts", seed=seed, progress=progress, **sampler)


def _half(problem, data, grid, half: str, sampler: dict, fits: int, progress: bool) -> tuple[dict, list]:
    """The predictive arrays of one half (``{"test/loc": [C·fits, S, ...], ...}``) and its fits' records."""
    arrays, records = {}, []
    for i in range(fits):
        seed = SEED_BASE[half] + i
        bnn = problem_model(problem, data, seed)
        started = time.perf_counter()
        posterior = _fit(problem, bnn, data, sampler, seed, progress, desc=f"smc {half}{i + 1}/{fits}")
        records.append(_fit_record(posterior, time.perf_counter() - started))
        for where, x in (("test", data.x_test), ("grid", grid)):
            if x is None:
                continue
            for key, value in _predictive_arrays(posterior, x, seed).items():
                arrays.setdefault(f"{where}/{key}", []).append(value)
    return {key: np.concatenate(parts) for key, parts in arrays.items()}, records


def _mixture(arrays: dict, prefix: str) -> PredictiveMixture:
    loc, scale = (torch.from_numpy(arrays[f"{prefix}/{k}"]) for k in ("loc", "scale"))
    return PredictiveMixture(loc.reshape(-1, *loc.shape[2:]), scale.reshape(-1, *scale.shape[2:]))


def _score(task: str, method: dict, reference: dict) -> dict:
    """Fidelity of the test-point arrays ``method`` against ``reference`` (both a half's arrays)."""
    if task == "classification":
        flat = [torch.from_numpy(a["test/probs"]).flatten(0, 1) for a in (method, reference)]
        return classification_fidelity(*flat)
    return regression_fidelity(_mixture(method, "test"), _mixture(reference, "test"))


def build_reference(problem, out=None, *, sampler: Optional[dict] = None, fits: Optional[int] = None,
                    overwrite: bool = False, progress: bool = True, tiny: bool = False) -> Path:
    """Build ``problem`` (a :class:`ReferenceProblem` or its name) into ``out`` (default
    ``references_root() / NAME``); returns the folder.  ``sampler`` / ``fits`` replace the problem's
    settings (``tiny=True``: :data:`lab.references.problems.TINY` and one fit per half, or
    :data:`~lab.references.problems.TINY_SMC` and two runs per half, seconds long, for tests: marked
    ``"tiny": true``, never meeting the targets)."""
    problem = get_problem(problem) if isinstance(problem, str) else problem
    out = Path(out) if out is not None else references_root() / problem.name
    smc = problem.method == "smc"
    sampler = dict((TINY_SMC if smc else TINY) if tiny else (sampler or problem.sampler))
    fits = int(fits or ((2 if smc else 1) if tiny else problem.fits))
    if smc:
        SMCConfig(**sampler)  # bad options: a ValueError before any work
    started, cpu_started, load_start = time.perf_counter(), time.process_time(), os.getloadavg()
    with staged_directory(out, overwrite) as staging:  # the destination is checked before any work
        body = train_body(problem, progress, map_steps=sampler["map_steps"] if tiny else None) \
            if problem.frozen_body else None
        data = problem_data(problem, body)
        grid = plot_grid(problem, data)
        halves, records = {}, {}
        for half in HALVES:
            halves[half], records[half] = _half(problem, data, grid, half, sampler, fits, progress)
        # NUTS: the within-fit diagnostics over each fit's chains; SMC: each run is one chain
        chains_per_fit = int(sampler["num_chains"]) if not smc and fits > 1 and int(sampler["num_chains"]) >= 2 else None
        diagnostics = {half: predictive_diagnostics(halves[half], chains_per_fit) for half in HALVES}
        floor = _score(data.task, halves["b"], halves["a"])
        arrays = {f"{half}/{key}": value for half in HALVES for key, value in halves[half].items()}
        arrays.update({"x_test": data.x_test.float().numpy(), "y_test": data.y_test_original().numpy()})
        if grid is not None:
            arrays["x_grid"] = grid.numpy()
        if body is not None:
            arrays.update({f"body/{k}": v.float().numpy() for k, v in body.items()})
        np.savez(staging / ARRAYS, **arrays)
        rhat = max(d["rhat_max"] for d in diagnostics.values())
        ess = min(d["ess_bulk_min"] for d in diagnostics.values())
        manifest = {
            "format": FORMAT, "name": problem.name, "description": problem.description, "tiny": bool(tiny),
            "problem": {"spec": problem.spec.to_dict(), "data_seed": problem.data_seed,
                        "frozen_body": problem.frozen_body, "grid": problem.grid},
            "task": data.task, "data": {**data.summary(), "fingerprint": data_fingerprint(data)},
            "model": model_signature(problem_model(problem, data, 0)),
            "sampler": {"backend": problem.method, "options": sampler, "fits_per_half": fits,
                        "seeds": {h: [SEED_BASE[h] + i for i in range(fits)] for h in HALVES}},
            "fits": records, "versions": _versions(),
            "diagnostics": diagnostics, "rhat_max": rhat, "ess_bulk_min": ess,
            "targets": {"rhat_max": RHAT_TARGET, "ess_bulk_min": ESS_TARGET},
            "meets_targets": bool(not tiny and rhat <= RHAT_TARGET and ess >= ESS_TARGET),
            "noise_floor": floor,
            "arrays": {k: {"shape": list(v.shape), "dtype": v.dtype.str} for k, v in arrays.items()},
            "build_seconds": time.perf_counter() - started, "build_cpu_seconds": time.process_time() - cpu_started,
            "load_average": {"start": list(load_start), "end": list(os.getloadavg())},
            "torch_threads": torch.get_num_threads(),
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return out.absolute()


# ------------------------------------------------------------------ load
@dataclass
class Reference:
    """A loaded reference: its manifest, its problem and its arrays (``{"a/test/loc": ndarray, ...}``)."""

    path: Path
    manifest: dict
    problem: ReferenceProblem
    arrays: dict

    @property
    def name(self) -> str:
        return self.manifest["name"]

    @property
    def task(self) -> str:
        return self.manifest["task"]

    @property
    def x_test(self) -> torch.Tensor:
        return torch.from_numpy(self.arrays["x_test"])

    @property
    def x_grid(self) -> Optional[torch.Tensor]:
        return torch.from_numpy(self.arrays["x_grid"]) if "x_grid" in self.arrays else None

    def body(self) -> Optional[dict]:
        """The frozen body's state dict (frozen-body problems), else ``None``."""
        items = {k[5:]: torch.from_numpy(v) for k, v in self.arrays.items() if k.startswith("body/")}
        return items or None

    def half(self, half: str = "a") -> dict:
        """``{"test/loc": ..., "grid/probs": ...}``: one half's predictive arrays ``[C, S, ...]``."""
        if half not in HALVES:
            raise ValueError(f"half must be one of {HALVES}, got {half!r}")
        return {k[len(half) + 1:]: v for k, v in self.arrays.items() if k.startswith(f"{half}/")}

    def mixture(self, where: str = "test", half: str = "a") -> PredictiveMixture:
        """Regression: the half's predictive mixture at ``where`` (``"test"`` or ``"grid"``), original units."""
        return _mixture(self.half(half), where)

    def prob_draws(self, where: str = "test", half: str = "a") -> torch.Tensor:
        """Classification: the half's class-probability draws ``[C·S, N, K]`` at ``where``."""
        return torch.from_numpy(self.half(half)[f"{where}/probs"]).flatten(0, 1)


def load_reference(name_or_path) -> Reference:
    """Load and check a reference folder (by problem name in :func:`references_root`, or a path).

    Raises ``ValueError`` (:class:`lab.runs.store.StoreError`) for a folder that is missing, unsealed, damaged,
    of another format, or whose arrays do not match its manifest; the message says how to build it.
    """
    path = reference_path(name_or_path)
    try:
        verify_run(path, (MANIFEST, ARRAYS))
    except StoreError as err:
        hint = f"; build it with: python -m zoo reference build {path.name}" if not path.exists() else ""
        raise StoreError(f"reference {name_or_path}: {err}{hint}") from None
    with open(path / MANIFEST, "rb") as fh:
        raw = fh.read(_MAX_MANIFEST + 1)
    try:
        manifest = json.loads(raw) if len(raw) <= _MAX_MANIFEST else None
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise StoreError(f"{path / MANIFEST} is not a {FORMAT} manifest")
    problem = get_problem(str(manifest.get("name")))
    try:
        with np.load(path / ARRAYS, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (ValueError, OSError) as err:
        raise StoreError(f"{path / ARRAYS} is unreadable ({err})") from None
    listed = manifest.get("arrays", {})
    for key, record in listed.items():
        if key not in arrays or list(arrays[key].shape) != record.get("shape") or arrays[key].dtype.str != record.get("dtype"):
            raise StoreError(f"{path / ARRAYS}: array {key!r} is missing or not of the shape and type its manifest records")
    if set(arrays) != set(listed):
        raise StoreError(f"{path / ARRAYS} holds arrays its manifest does not list: {sorted(set(arrays) - set(listed))}")
    return Reference(path.absolute(), manifest, problem, arrays)


def list_references() -> list:
    """One row per problem: name, built or not, its diagnostics and build time where built."""
    rows = []
    for name, problem in PROBLEMS.items():
        row = {"name": name, "description": problem.description, "built": False}
        try:
            manifest = load_reference(name).manifest
        except (StoreError, ValueError):
            manifest = None
        if manifest is not None:
            row.update(built=True, rhat_max=manifest["rhat_max"], ess_bulk_min=manifest["ess_bulk_min"],
                       meets_targets=manifest["meets_targets"], build_seconds=manifest["build_seconds"],
                       tiny=manifest["tiny"])
        rows.append(row)
    return rows
