"""Regenerate ``docs/figures/toy1d_variational.png``: seed 002 §4.3's 1-D regression (40 points)
fitted with sparse variational dropout, Graves's variational dense layers and a deterministic
network, with 90% posterior predictive bands.

Set-up after seed 002 §4.3: an MLP with one hidden layer of 64 ReLU units, full-batch Adam,
learning rate 0.1 for the first quarter of training then 0.01 (``lr_schedule="step"``), the KL
switched off for a warm-up and then annealed linearly; Graves uses a N(0, 2²) prior.  The noise
precision is learned (Gamma prior) for all three; the deterministic net is backend ``svi`` with
``stochastic="none"`` (only the noise is inferred), so its band is aleatoric only.

Usage: ``python docs/toy1d_variational.py [--out docs/figures/toy1d_variational.png] [--epochs 3000]``
Prints the test RMSE and test log-likelihood of each fit.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from inference import evaluate, fit  # noqa: E402
from zoo import BayesianNetwork, GaussianLikelihood  # noqa: E402
from zoo.architectures import build_architecture  # noqa: E402
from zoo.data import load_dataset, toy1d_curve  # noqa: E402

FITS = {
    "sparse VD (Molchanov et al. 2017)": ("sparse-vd", "all", {}),
    "Graves (2011), prior N(0, 2²)": ("graves", "all", {"prior_sd": 2.0}),
    "deterministic": ("svi", "none", {}),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "figures" / "toy1d_variational.png"))
    parser.add_argument("--epochs", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    data = load_dataset("toy1d", seed=args.seed)
    grid = torch.linspace(float(data.x_test.min()), float(data.x_test.max()), 300).unsqueeze(1)
    grid_x = data.x_to_original(grid).squeeze(1).numpy()
    train_x = data.x_to_original(data.x_train).squeeze(1).numpy()
    schedule = {
        "epochs": args.epochs,
        "batch_size": None,
        "lr": 0.1,
        "lr_schedule": "step",
        "lr_final_factor": 0.1,
        "lr_step_fraction": 0.25,
    }
    annealing = {"kl_warmup_epochs": int(0.375 * args.epochs), "kl_anneal_epochs": int(0.5 * args.epochs)}
    fig, axes = plt.subplots(1, len(FITS), figsize=(15, 4.2), sharey=True)
    for ax, (title, (backend, stochastic, extra)) in zip(axes, FITS.items()):
        torch.manual_seed(args.seed)
        net = build_architecture("mlp", 1, 1, hidden=[64])
        bnn = BayesianNetwork(
            net, stochastic=stochastic, likelihood=GaussianLikelihood(learn_noise=True),
            output_dim=1, target_loc=data.y_loc, target_scale=data.y_scale,
        )
        options = {**schedule, **extra, **(annealing if backend != "svi" else {})}
        post = fit(bnn, data.x_train, data.y_train, backend=backend, seed=args.seed, progress=False, **options)
        metrics = evaluate(post.predict(data.x_test, y=data.y_test_original(), seed=args.seed), data.y_test_original())
        pred = post.predict(grid, seed=args.seed)
        lo, hi = (t.squeeze(1).numpy() for t in pred.interval(0.9))
        ax.fill_between(grid_x, lo, hi, color="tab:blue", alpha=0.25, label="90% predictive band")
        ax.plot(grid_x, pred.mean.squeeze(1).numpy(), color="tab:blue", label="predictive mean")
        ax.plot(grid_x, toy1d_curve(grid_x), "k--", lw=1, label="true signal")
        ax.scatter(train_x, data.y_train_original().squeeze(1).numpy(), s=12, color="k", zorder=3, label="40 training points")
        ax.set_title(f"{title}\nRMSE {metrics['rmse']:.3f}, test LL {metrics['test_ll']:.2f}", fontsize=10)
        ax.set_xlabel("x")
        print(f"{backend:10s} rmse {metrics['rmse']:.4f} test_ll {metrics['test_ll']:.3f}")
    axes[0].set_ylabel("y")
    axes[0].legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
