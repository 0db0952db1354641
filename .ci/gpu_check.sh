#!/usr/bin/env bash
# The GPU checks, for a machine with a CUDA device and PyTorch (CI has none: these are run by hand).
#   bash .ci/gpu_check.sh [LOG_DIR]
# Wheels in .whl/ (pyro-ppl, pyro-api, arviz, xarray-einstats, h5netcdf, platformdirs) are
# installed into /tmp/site first when present, for an image that lacks them.
set -uo pipefail
log_dir=${1:-${OUT:-/tmp}}
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import torch, pyro, arviz; print('torch', torch.__version__, 'pyro', pyro.__version__, 'arviz', arviz.__version__, 'cuda', torch.cuda.is_available())"
timeout 420 python3 -m pytest -q -p no:cacheprovider -rfE --durations 8 -k cuda \
    tests/inference/backends/test_cuda.py tests/zoo/test_stochastic.py 2>&1 | tee "$log_dir/pytest-cuda.log"
status=$?
timeout 120 python3 benchmarks/svi_step.py --device cuda --rounds 10 --no-trace-reference 2>&1 | tee "$log_dir/svi-step-cuda.log"
exit $status
