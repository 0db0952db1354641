"""Why ``digits-rotated`` standardises the pixels with one scale: rotated digits under both scalings.

The ``digits`` dataset standardises each pixel with its own training mean and sd; a pixel that is almost
always blank has an sd near 0.002, so a stroke rotated onto it becomes an input hundreds of sds out.
``digits-rotated`` uses one mean and sd over all pixels instead (:mod:`zoo.data.digits_shift`).  This
script fits the same MAP (LeNet-300-100, the ``shift-rotation`` grid's budget: 30 epochs of minibatches
of 128) under both scalings and prints, per angle, accuracy and NLL, and the largest absolute input of
the rotated test set:

    python benchmarks/shift_pixel_scaling.py [--seed 0] [--step 30]

The last line is ``pixel_scaling_nll_ratio_at_90 R``: the per-pixel model's NLL at 90° over the
one-scale model's.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from inference import fit  # noqa: E402
from inference.evaluation.metrics import classification_metrics  # noqa: E402
from lab.runs.model import build_model  # noqa: E402
from lab.runs.spec import RunSpec  # noqa: E402
from zoo.data import load_dataset, rotate_images, rotation_angles  # noqa: E402
from zoo.data.sklearn_sets import digits_split  # noqa: E402


def per_pixel_rotated(seed: int, step: float):
    """``digits`` (per-pixel standardisation) with the rotated test sets standardised the same way."""
    data = load_dataset("digits", seed=seed)
    _, x_test, _, y_test = digits_split(0.25, seed)
    loc, scale = data.x_loc.double().numpy(), data.x_scale.double().numpy()
    sets = {a: torch.as_tensor((rotate_images(x_test.reshape(-1, 8, 8), a).reshape(len(x_test), -1) - loc) / scale,
                               dtype=torch.float32) for a in rotation_angles(step)}
    return data, sets, torch.as_tensor(y_test)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step", type=float, default=30.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    global_scale = load_dataset(f"digits-rotated:{args.step}", seed=args.seed)
    pixel_data, pixel_sets, labels = per_pixel_rotated(args.seed, args.step)
    spec = RunSpec(data="digits", model="lenet300100", stochastic="all", backend="map", seed=args.seed)
    results = {}
    for name, data, sets in (("per-pixel", pixel_data, pixel_sets),
                             ("one scale", global_scale, {s.value: s.x for s in global_scale.shift_sets})):
        posterior = fit(build_model(dataclasses.replace(spec), data), data.x_train, data.y_train, backend="map",
                        epochs=30, batch_size=128, seed=args.seed, progress=False)
        results[name] = {a: (classification_metrics(posterior.predict(x, y=labels, seed=0), labels),
                             float(x.abs().max())) for a, x in sets.items()}
    print(f"{'angle':>6} | {'per-pixel acc':>13} {'NLL':>7} {'max |x|':>8} | {'one scale acc':>13} {'NLL':>7} {'max |x|':>8}")
    for angle in results["per-pixel"]:
        cells = []
        for name in ("per-pixel", "one scale"):
            metrics, largest = results[name][angle]
            cells.append(f"{metrics['accuracy']:13.3f} {metrics['nll']:7.3f} {largest:8.1f}")
        print(f"{angle:6g} | " + " | ".join(cells))
    ninety = min(results["per-pixel"], key=lambda a: abs(a - 90))
    ratio = results["per-pixel"][ninety][0]["nll"] / results["one scale"][ninety][0]["nll"]
    print(f"pixel_scaling_nll_ratio_at_90 {ratio:.2f}")


if __name__ == "__main__":
    main()
