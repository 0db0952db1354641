"""Is an every-weight regression reference's posterior dominated by one basin? (issue 37: energy-small, yacht-small)

The measurement behind the "basin-aware reference" idea: if the posterior over every weight were dominated by one
functional basin (up to the weight-space symmetries, which leave the predictive unchanged), a reference could find
that basin by many MAP restarts and sample inside it with NUTS under a metric fitted to its curvature.  Three
measurements on the problem's exact model (:func:`lab.references.problems.problem_model`, float64) and the log
density NUTS samples (:class:`inference.optim.potential.Potential`: unconstrained coordinates, the noise precision
through its log-Jacobian):

* ``search`` — ``--restarts`` K MAP runs from independent prior draws of the weights (the noise precision at its
  prior median), all K as one batch: full-batch Adam (cosine-decayed learning rate) then saddle-free damped Newton
  steps z ← z + V diag(1/(|λ| + μ)) Vᵀ ∇ log π (Dauphin et al. 2014; μ adapted Levenberg–Marquardt style), to
  ‖∇ log π‖ < 10⁻⁶.  Per end: the log joint log π(ẑ), the noise sd (standardised units), the Laplace evidence

      log Z_Laplace = log π(ẑ) + D/2 log 2π − ½ log det H,   H = −∇² log π(ẑ)  (positive definite, or flagged),

  and the predictive mean at the test points.  Two ends are the same *function* when the RMS difference of their
  predictive means is below ``--same`` times the best end's noise sd.  The table lists every end by its Laplace
  evidence with its distance from the best in noise sds; with ``--check M``, the top ends' Laplace Gaussians are
  tested by importance sampling (M draws from N(ẑ, H⁻¹): the mean of log π(z) − log π(ẑ), −D/2 for a Gaussian
  basin, the importance estimate of the basin's log mass and its ESS fraction).
* ``compare A B`` — whether two independent batches found the same functions: for every end of B the nearest end of
  A (in noise sds), and the two batches' best evidences.
* ``sample`` — NUTS (:mod:`inference.mcmc`) in the basin of the best end of a batch: ``--chains`` chains started
  at draws of its Laplace Gaussian, the dense metric its inverse Hessian (eigenvalues floored at 10⁻²), kept
  (``--adapt``: the warm-up's first metric, re-estimated), step size adapted; it prints the tree depths, step sizes,
  the chains' noise sd and log density, their Mahalanobis distance from the mode and the rank-normalised R-hat /
  bulk ESS of the predictive location and noise scale at the test points
  (:func:`lab.references.diagnostics.predictive_diagnostics`).

Usage (RESULTS, section 10, the basin-aware measurement)::

    python benchmarks/reference_basins.py search yacht-small --restarts 64 --seed 11 --out /tmp/yacht_11.npz --check 4000
    python benchmarks/reference_basins.py compare /tmp/yacht_11.npz /tmp/yacht_12.npz
    python benchmarks/reference_basins.py sample yacht-small /tmp/yacht_11.npz --chains 4 --warmup 100 --samples 100
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

from inference.mcmc.chains import sample_chains
from inference.mcmc.kernels import build_nuts
from inference.mcmc.mass_matrix import euclidean_metric
from inference.optim.potential import Potential, frozen_deterministic
from inference.smc.fit import prior_particles
from lab.references.diagnostics import predictive_diagnostics
from lab.references.problems import get_problem, problem_data, problem_model

__all__ = ["problem_potential", "batched_hessian", "multi_start", "laplace_table", "importance_check", "compare",
           "sample_basin", "main"]

#: the smallest eigenvalue of H kept in the sampling metric (no direction wider than 10 unconstrained units)
METRIC_FLOOR = 1e-2


def problem_potential(name: str):
    """``(bnn, potential, x_test)`` of reference problem ``name`` in float64 (the weights' values are not used)."""
    problem = get_problem(name)
    data = problem_data(problem)
    bnn = problem_model(problem, data, 0).double()
    return bnn, Potential(bnn, data.x_train.double(), data.y_train.double()), data.x_test.double()


def batched_hessian(potential: Potential, z: torch.Tensor) -> torch.Tensor:
    """``[K, D, D]``: the Hessian of −log π at each of ``z`` ``[K, D]`` (symmetrised), all K·D Hessian-vector
    products in one double-backward pass."""
    num, dim = z.shape
    probes = torch.eye(dim, dtype=z.dtype).repeat(num, 1)
    with torch.enable_grad():
        point = z.detach().repeat_interleave(dim, 0).requires_grad_(True)
        (grad,) = torch.autograd.grad(-potential.log_density(point).sum(), point, create_graph=True)
        (hvp,) = torch.autograd.grad((grad * probes).sum(), point)
    h = hvp.reshape(num, dim, dim)
    return 0.5 * (h + h.transpose(1, 2))


def multi_start(potential: Potential, restarts: int, seed: int, adam_steps: int = 8000, lr: float = 0.02,
                newton_steps: int = 200, tol: float = 1e-6) -> tuple[torch.Tensor, dict]:
    """``(z [K, D], record)``: K MAP ends from prior draws (module docstring); ``record`` has the seconds and the
    Newton iterations taken."""
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    latent = potential.blocks[-1]
    z = prior_particles(potential, restarts, generator)
    if latent.transform is not None:  # the noise precision at its prior median (prior draws reach sd ≫ the data's)
        median = potential.latent_init()[latent.name].to(z)
        z[:, latent.start:latent.stop] = latent.transform.inv(median).reshape(1, -1)
    z.requires_grad_(True)
    optimiser = torch.optim.Adam([z], lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, adam_steps, eta_min=lr / 200)
    for _ in range(adam_steps):
        optimiser.zero_grad()
        (-potential.log_density(z).sum()).backward()
        optimiser.step()
        schedule.step()
    z = z.detach()
    adam_seconds = time.perf_counter() - started
    damping = torch.full((restarts,), 1e-3, dtype=z.dtype)
    lp, grad = potential.value_and_grad(z)
    for it in range(newton_steps):
        eigenvalues, vectors = torch.linalg.eigh(batched_hessian(potential, z))
        coefficients = (vectors.transpose(1, 2) @ grad.unsqueeze(-1)).squeeze(-1) / (eigenvalues.abs() + damping[:, None])
        proposal = z + (vectors @ coefficients.unsqueeze(-1)).squeeze(-1)
        lp_new, grad_new = potential.value_and_grad(proposal)
        better = torch.isfinite(lp_new) & (lp_new >= lp - 1e-9)
        z = torch.where(better[:, None], proposal, z)
        lp, grad = torch.where(better, lp_new, lp), torch.where(better[:, None], grad_new, grad)
        damping = torch.where(better, (damping / 3).clamp(min=1e-10), damping * 10)
        if bool(((grad.norm(dim=-1) < tol) | (damping > 1e8)).all()):
            break
    return z, {"adam_seconds": adam_seconds, "seconds": time.perf_counter() - started, "newton_iterations": it + 1}


def laplace_table(bnn, potential: Potential, z: torch.Tensor, x_test: torch.Tensor) -> dict:
    """Per end of ``z`` ``[K, D]``: ``lp``, ``laplace`` (NaN where H is not positive definite), ``min_eigenvalue``,
    ``grad_norm``, ``noise_sd`` (standardised), ``f_test`` ``[K, T]`` (predictive means, standardised), ``H``."""
    h = batched_hessian(potential, z)
    eigenvalues = torch.linalg.eigvalsh(h)
    lp, grad = potential.value_and_grad(z)
    values, _ = potential.unpack(z)
    log_det = torch.linalg.slogdet(h)[1]
    laplace = lp + 0.5 * potential.dim * math.log(2 * math.pi) - 0.5 * log_det
    laplace = torch.where(eigenvalues[:, 0] > 0, laplace, torch.full_like(laplace, float("nan")))
    return {"lp": lp, "laplace": laplace, "min_eigenvalue": eigenvalues[:, 0], "grad_norm": grad.norm(dim=-1),
            "noise_sd": values[potential.blocks[-1].name].reshape(len(z)).rsqrt(),
            "f_test": bnn.forward_draws(values, x_test)[..., 0], "H": h, "z": z}


def _ranked(table: dict) -> list:
    return torch.argsort(torch.nan_to_num(table["laplace"], nan=-math.inf), descending=True).tolist()


def functions(table: dict, same: float) -> list:
    """Groups of ends (indices, best Laplace evidence first) whose test predictive means are within ``same`` times
    the best end's noise sd (RMS) of the group's first end."""
    order = _ranked(table)
    scale = float(table["noise_sd"][order[0]])
    groups: list = []
    for k in order:
        for group in groups:
            if float((table["f_test"][k] - table["f_test"][group[0]]).pow(2).mean().sqrt()) < same * scale:
                group.append(k)
                break
        else:
            groups.append([k])
    return groups


def importance_check(potential: Potential, table: dict, k: int, draws: int, seed: int = 0) -> dict:
    """End ``k``'s Laplace Gaussian N(ẑ, H⁻¹) against the basin: ``drop`` the mean of log π(z) − log π(ẑ) over its
    draws (−D/2 for a Gaussian basin), ``log_mass`` the importance estimate log mean π(z)/q(z), ``ess`` its
    fraction of effective draws."""
    eigenvalues, vectors = torch.linalg.eigh(table["H"][k])
    generator = torch.Generator().manual_seed(seed)
    eps = torch.randn(draws, potential.dim, generator=generator, dtype=torch.float64)
    z = table["z"][k] + eps @ (vectors / eigenvalues.sqrt()).T
    lp = potential.log_density(z)
    log_q = -0.5 * eps.pow(2).sum(-1) - 0.5 * potential.dim * math.log(2 * math.pi) + 0.5 * float(eigenvalues.log().sum())
    log_w = torch.nan_to_num(lp - log_q, nan=-math.inf)
    weights = torch.softmax(log_w, 0)
    return {"drop": float((lp - table["lp"][k]).mean()), "log_mass": float(torch.logsumexp(log_w, 0) - math.log(draws)),
            "ess": float(1 / weights.pow(2).sum()) / draws}


def _save(path: str, table: dict, record: dict, name: str, seed: int) -> None:
    np.savez(path, **{k: v.detach().numpy() for k, v in table.items()}, name=np.array(name), seed=np.array(seed),
             seconds=np.array(record["seconds"]))


def _load(path: str) -> dict:
    with np.load(path, allow_pickle=False) as npz:
        return {k: (torch.from_numpy(npz[k]) if npz[k].dtype.kind == "f" else npz[k].item()) for k in npz.files}


def compare(a: dict, b: dict) -> dict:
    """Batch ``b`` against ``a``: each end of b's nearest end of a (RMS of the test predictive means in units of the
    best noise sd of both), the same within a, and the two best ends' distance."""
    scale = float(min(a["noise_sd"].min(), b["noise_sd"].min()))
    root = a["f_test"].shape[-1] ** 0.5
    across = torch.cdist(b["f_test"], a["f_test"]) / root / scale
    within = torch.cdist(a["f_test"], a["f_test"]) / root / scale
    within.fill_diagonal_(float("inf"))
    best_a, best_b = _ranked(a)[0], _ranked(b)[0]
    return {"scale": scale, "across_min": float(across.min()), "across_median": float(across.min(1).values.median()),
            "within_min": float(within.min()), "within_median": float(within.min(1).values.median()),
            "matched": int((across.min(1).values < 0.1).sum()), "ends": len(b["f_test"]),
            "best_distance": float(across[best_b, best_a]),
            "best_laplace": (float(a["laplace"][best_a]), float(b["laplace"][best_b]))}


def sample_basin(bnn, potential: Potential, x_test: torch.Tensor, table: dict, chains: int, warmup: int, samples: int,
                 seed: int, adapt: bool = False, rank: int = 0) -> dict:
    """NUTS in the basin of the ``rank``-th best end (module docstring); the run's summary."""
    k = _ranked(table)[rank]
    z0, h = table["z"][k], table["H"][k]
    eigenvalues, vectors = torch.linalg.eigh(h)
    covariance = (vectors / eigenvalues.clamp(min=METRIC_FLOOR)) @ vectors.T
    covariance = 0.5 * (covariance + covariance.T)
    generator = torch.Generator().manual_seed(seed)
    starts = z0 + torch.randn(chains, potential.dim, generator=generator, dtype=z0.dtype) @ torch.linalg.cholesky(covariance).T
    started = time.perf_counter()
    with torch.no_grad(), frozen_deterministic(bnn):
        z, stats, record = sample_chains(
            potential, starts, build_nuts(potential, False, 1000.0, 10), generator, False, "basin",
            warmup_steps=warmup, num_samples=samples, thin=1, step_size=0.5, target_accept=0.9, dense_mass=True,
            pool_adaptation=False, adapt_step_size=True, adapt_mass=adapt,
            initial_metric=euclidean_metric(covariance.expand(chains, *covariance.shape).clone()))
        values, _ = potential.unpack(z)
        flat = {name: v.reshape(chains * samples, *v.shape[2:]) for name, v in values.items()}
        loc = bnn.forward_draws(flat, x_test)[..., 0].reshape(chains, samples, -1)
        noise = values[potential.blocks[-1].name].reshape(chains, samples, 1).rsqrt()
    diagnostics = predictive_diagnostics({"test/loc": loc.float().numpy(), "test/scale": noise.float().numpy()})
    offset = z[:, -1] - z0
    return {"end": k, "lp_mode": float(table["lp"][k]), "seconds": time.perf_counter() - started,
            "step_size": record["step_size"], "tree_depth_mean": float(stats["tree_depth"].float().mean()),
            "tree_depth_at_cap": float((stats["tree_depth"] >= 10).float().mean()),
            "divergences": int(stats["diverging"].sum()), "lp_chain_mean": stats["lp"].mean(1).tolist(),
            "noise_sd_chain_mean": noise.mean((1, 2)).tolist(),
            "mahalanobis_sq_per_dim": ((offset @ h) * offset).sum(-1).div(potential.dim).tolist(),
            "rhat_max": diagnostics["rhat_max"], "ess_bulk_min": diagnostics["ess_bulk_min"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    search = sub.add_parser("search")
    search.add_argument("problem")
    search.add_argument("--restarts", type=int, default=64)
    search.add_argument("--seed", type=int, default=0)
    search.add_argument("--adam-steps", type=int, default=8000)
    search.add_argument("--same", type=float, default=0.1)
    search.add_argument("--check", type=int, default=0, help="importance draws per checked end (0: no check)")
    search.add_argument("--out")
    pair = sub.add_parser("compare")
    pair.add_argument("a")
    pair.add_argument("b")
    run = sub.add_parser("sample")
    run.add_argument("problem")
    run.add_argument("batch")
    run.add_argument("--chains", type=int, default=4)
    run.add_argument("--warmup", type=int, default=100)
    run.add_argument("--samples", type=int, default=100)
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--adapt", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.command == "compare":
        print(compare(_load(args.a), _load(args.b)))
        return
    bnn, potential, x_test = problem_potential(args.problem)
    if args.command == "sample":
        print(sample_basin(bnn, potential, x_test, _load(args.batch), args.chains, args.warmup, args.samples, args.seed,
                           args.adapt))
        return
    with frozen_deterministic(bnn):
        z, record = multi_start(potential, args.restarts, args.seed, args.adam_steps)
        table = laplace_table(bnn, potential, z, x_test)
        groups = functions(table, args.same)
        print(f"# {args.problem}: {args.restarts} restarts (seed {args.seed}), D = {potential.dim}, "
              f"{record['seconds']:.0f} s ({record['newton_iterations']} Newton iterations); "
              f"{len(groups)} distinct functions (RMS < {args.same} noise sd)")
        print("rank end  found  log_joint  laplace  noise_sd  min_eig   |grad|   rms_vs_best/sd")
        best = groups[0][0]
        scale = float(table["noise_sd"][best])
        for i, group in enumerate(groups):
            k = group[0]
            rms = float((table["f_test"][k] - table["f_test"][best]).pow(2).mean().sqrt()) / scale
            print(f"{i:4d} {k:3d} {len(group):5d} {float(table['lp'][k]):10.2f} {float(table['laplace'][k]):8.2f} "
                  f"{float(table['noise_sd'][k]):8.4f} {float(table['min_eigenvalue'][k]):9.2e} "
                  f"{float(table['grad_norm'][k]):8.1e} {rms:8.2f}")
        if args.check:
            print(f"Laplace Gaussian vs basin ({args.check} draws; a Gaussian basin: drop = {-potential.dim / 2:.1f})")
            for group in groups[:5]:
                if float(table["min_eigenvalue"][group[0]]) > 0:
                    print(group[0], importance_check(potential, table, group[0], args.check))
    if args.out:
        _save(args.out, table, record, args.problem, args.seed)


if __name__ == "__main__":
    main()
