#!/usr/bin/env bash
# The installed package, not the checkout: build the sdist and wheel, install the wheel (not editable)
# into a fresh environment and run README's main job and `bnn-zoo --help` from an empty folder outside
# the checkout, so the bundled data must come from the package.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
rm -rf dist
.venv/bin/python -m build --sdist --wheel --outdir dist . >/dev/null
wheel=$(ls dist/*.whl)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$PYTHON" -m venv "$scratch/env"
"$scratch/env/bin/python" -m pip install --quiet --upgrade pip
"$scratch/env/bin/python" -m pip install --quiet "torch==2.13.0"   # the local CPU wheel (see .ci/install)
"$scratch/env/bin/python" -m pip install --quiet "$PWD/$wheel"
mkdir "$scratch/work"
cd "$scratch/work"
"$scratch/env/bin/bnn-zoo" --help >/dev/null
"$scratch/env/bin/python" -c "import importlib.metadata as m, zoo; assert zoo.__version__ == m.version('bnn-zoo'), (zoo.__version__, m.version('bnn-zoo'))"
"$scratch/env/bin/python" -m zoo fit --data uci:energy --model mlp --stochastic all --backend svi --split 0 --seed 0 \
    --out runs/energy --quiet
test -f runs/energy/COMPLETE
echo "wheel check: $(basename "$wheel") installed outside the checkout ran the main job"
