#!/usr/bin/env bash
# PyTorch for the parity test (e2e/parity_torch_test.go runs bench/torch_train.py with it):
#
#   scripts/install_torch.sh        # prints the interpreter: ~/.cache/distflash/torch/bin/python
#
# A virtual environment at $DISTFLASH_TORCH_VENV (default ${XDG_CACHE_HOME:-~/.cache}/distflash/torch)
# with torch $TORCH_VERSION and numpy (torch warns without it) from PyPI, kept between runs: a
# second run only checks it. PyPI's Linux torch is the CUDA build (its CUDA libraries come as
# nvidia-* wheels, which import torch loads even on a CPU); the CPU-only wheels are on PyTorch's
# own index, which CI does not reach. Measured here: 55 s to download and install with an empty
# pip cache, 5.4 GB installed; a second run 1.4 s.
set -euo pipefail
version=${TORCH_VERSION:-2.15.0}
venv=${DISTFLASH_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/distflash/torch}
py="$venv/bin/python"
if [ -x "$py" ] && "$py" -c "import numpy, torch, sys; sys.exit(torch.__version__.split('+')[0] != '$version')" 2>/dev/null; then
	echo "$py"
	exit 0
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv" >&2 || { echo "install_torch.sh: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
start=$SECONDS
"$py" -m pip install --quiet --disable-pip-version-check --no-cache-dir "torch==$version" numpy >&2
"$py" -c 'import torch; torch.ones(2) @ torch.ones(2)' >&2
echo "install_torch.sh: torch $version in $venv ($(du -sh "$venv" | cut -f1), $((SECONDS - start)) s)" >&2
echo "$py"
