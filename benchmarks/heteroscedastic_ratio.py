"""The heteroscedastic rows of a ``uci-benchmark`` summary beside the Gaussian row of the same backend and selector.

    python benchmarks/heteroscedastic_ratio.py runs/experiments/uci-benchmark/summary.csv

One Markdown row per (dataset, backend, selector) with a heteroscedastic row: its RMSE, test LL,
coverage_90 and the number of runs flagged ``failed_fit``, the Gaussian row's RMSE and test LL ("—" where the
summary has no Gaussian row) and the RMSE ratio (bold above 1.3, issue 29's bound).  Last line:
``heteroscedastic_max_rmse_ratio R`` over the rows that have both.
"""
from __future__ import annotations

import argparse

import pandas as pd


def ratio_table(summary: pd.DataFrame) -> tuple[list[str], float]:
    """Markdown lines and the largest RMSE ratio (NaN when no row has a Gaussian partner)."""
    lines = ["| dataset | backend | stochastic | heteroscedastic RMSE | test LL | coverage_90 | flagged | Gaussian RMSE "
             "| test LL | RMSE ratio |", "|---|---|---|---|---|---|---|---|---|---|"]
    keys = ["dataset", "backend", "stochastic"]
    het = summary[summary.likelihood == "heteroscedastic"].set_index(keys)
    gauss = summary[summary.likelihood == "gaussian"].set_index(keys)
    ratios = []
    for key, h in het.iterrows():
        g = gauss.loc[key] if key in gauss.index else None
        ratio = h["rmse_mean"] / g["rmse_mean"] if g is not None else float("nan")
        if g is not None:
            ratios.append(ratio)
        shown = "—" if g is None else (f"**{ratio:.2f}**" if ratio > 1.3 else f"{ratio:.2f}")
        lines.append(f"| {' | '.join(key)} | {h['rmse_mean']:.3f} ± {h['rmse_se']:.3f} | {h['test_ll_mean']:.2f} ± "
                     f"{h['test_ll_se']:.2f} | {h['coverage_90_mean']:.3f} | {int(h['failed_fit'])}/{int(h['n'])} | "
                     f"{'—' if g is None else format(g['rmse_mean'], '.3f')} | "
                     f"{'—' if g is None else format(g['test_ll_mean'], '.2f')} | {shown} |")
    return lines, max(ratios) if ratios else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summary", help="summary.csv of a uci-benchmark experiment")
    lines, worst = ratio_table(pd.read_csv(parser.parse_args().summary))
    print("\n".join(lines))
    print(f"heteroscedastic_max_rmse_ratio {worst:.2f}")


if __name__ == "__main__":
    main()
