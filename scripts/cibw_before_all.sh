#!/usr/bin/env bash
# Install the parts of the CUDA toolkit that the build needs, from NVIDIA's RHEL 8 repository, into a
# manylinux_2_28 (AlmaLinux 8) container: cibuildwheel's before-all, and CI's CUDA build.
#
#   CUDA_VERSION=13.0 bash scripts/cibw_before_all.sh
#
# Installs nvcc (with crt and nvvm), the runtime headers and libcudart, cuda.h, CCCL (nv/target),
# and cuobjdump + nvdisasm for scripts/check_wheel.py --require-sass. /usr/local/cuda points at it.
# x86_64 and aarch64 (NVIDIA calls the aarch64 server repository "sbsa").
set -euo pipefail

CUDA_VERSION="${CUDA_VERSION:-13.0}"
ver="${CUDA_VERSION//./-}"  # 13.0 -> 13-0, as in the package names

case "$(uname -m)" in
  x86_64) repo_arch=x86_64 ;;
  aarch64) repo_arch=sbsa ;;
  *) echo "cibw_before_all.sh: no CUDA repository for $(uname -m)" >&2; exit 1 ;;
esac

if command -v dnf >/dev/null 2>&1; then pm=dnf; elif command -v yum >/dev/null 2>&1; then pm=yum; else
  echo "cibw_before_all.sh: needs dnf or yum (a RHEL 8 compatible image such as manylinux_2_28)" >&2; exit 1
fi

repo_file=/etc/yum.repos.d/cuda-rhel8.repo
if [ ! -f "$repo_file" ]; then
  curl -fsSL --retry 5 --retry-delay 5 \
    "https://developer.download.nvidia.com/compute/cuda/repos/rhel8/${repo_arch}/cuda-rhel8.repo" -o "$repo_file"
fi

packages=(
  "cuda-nvcc-${ver}"          # nvcc, ptxas, fatbinary, nvlink (pulls cuda-crt, cuda-nvvm)
  "cuda-crt-${ver}"
  "cuda-nvvm-${ver}"
  "cuda-cudart-devel-${ver}"  # cuda_runtime.h, cuda_fp4.h / cuda_fp8.h / cuda_bf16.h, libcudart.so
  "cuda-driver-devel-${ver}"  # cuda.h (included by FlashInfer's headers)
  "cuda-cccl-${ver}"          # nv/target, cub, thrust, libcu++
  "cuda-cuobjdump-${ver}"     # for scripts/check_wheel.py: the Blackwell SASS check
  "cuda-nvdisasm-${ver}"
)
"$pm" install -y --setopt=install_weak_deps=False "${packages[@]}"
"$pm" clean all || true

if [ ! -e /usr/local/cuda ]; then
  ln -s "/usr/local/cuda-${CUDA_VERSION}" /usr/local/cuda
fi
/usr/local/cuda/bin/nvcc --version
echo "cibw_before_all.sh: CUDA ${CUDA_VERSION} toolkit at $(readlink -f /usr/local/cuda) ($(uname -m))"
