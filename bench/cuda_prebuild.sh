#!/usr/bin/env bash
# Fill .device/cache with every CUDA kernel the GPU checks load (bench/cuda_device_check.sh),
# compiled here for sm_90 with nvcc: no GPU needed, about 4 minutes on 2 cores. A GPU session
# then spends its minutes measuring rather than compiling.
#   bench/cuda_prebuild.sh [MODEL]      (default: the SmolLM2-135M Q4_1 file, by name)
set -eu
cd "$(dirname "$0")/.."
export GGMLPY_CACHE=$PWD/.device/cache PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
M=${1:-smollm2-135m}
mkdir -p "$GGMLPY_CACHE"
python -c "from ggmlpy.codegen_cuda.nvcc import nvcc_version, find_nvcc; print(nvcc_version(find_nvcc()))" > "$GGMLPY_CACHE/NVCC_VERSION"
python bench/bench_cuda.py --model "$M" --prebuild -n 8 > /dev/null
for r in 0 1 2; do
    GGMLPY_CUDA_MATVEC_ROWS=$r python bench/bench_cuda.py --synthetic smollm2 --prebuild -n 8 > /dev/null
done
GGMLPY_CUDA_ATTN_THREADS=256 python bench/bench_cuda.py --synthetic smollm2 --prebuild -n 8 > /dev/null
GGMLPY_CUDA_FUSE_OPROJ=1 python bench/bench_cuda.py --synthetic smollm2 --prebuild -n 8 > /dev/null
GGMLPY_CUDA_FUSE_OPROJ=1 python bench/bench_cuda.py --model "$M" --prebuild -n 8 > /dev/null
# the GPU tests' kernels (the run itself fails by design: the dry-run driver only compiles)
GGMLPY_CUDA_PREBUILD=1 python -m pytest -q -p no:cacheprovider tests/ggmlpy/codegen_cuda -k "not emu" > /dev/null 2>&1 || true
echo "$(find "$GGMLPY_CACHE" -name '*.cubin' | wc -l) kernel modules in $GGMLPY_CACHE"
