# Make this checkout importable as `fp8rl` on a GPU machine that has torch but no package index
# (the H200 device: no pydantic, no Ray). Source it from the repository root:
#
#   source benchmarks/device_env.sh && python3 -m pytest -m gpu tests/fp8_kernels tests/gpu
#
# Wheels missing there travel in ./.whl (git-ignored), fetched here with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux2014_x86_64 -d .whl \
#     pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.7.0 typing-inspection==0.4.5 typing-extensions
# The package is a symlink farm (/tmp/fp8rl-pkg/fp8rl/<folder> → ./<folder>), the same mapping
# as pyproject's package-dir, so no build step runs on the device.
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/fp8rl-site .whl/*.whl || return 1
fi
mkdir -p /tmp/fp8rl-pkg/fp8rl
for d in services workers protocol kernels; do ln -sfn "$PWD/$d" "/tmp/fp8rl-pkg/fp8rl/$d"; done
export PYTHONPATH="/tmp/fp8rl-pkg:/tmp/fp8rl-site:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python3 -c "import torch, fp8rl.protocol, fp8rl.kernels; print('fp8rl on', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
