#!/usr/bin/env bash
# The CUDA backend's checks on a GPU machine, as one script:
#   env     the GPU, driver, nvcc and Python packages seen
#   tests   tests/ggmlpy/codegen_cuda on the GPU: every op case against the reference backend, the fused
#           kernels on whole graphs, a tiny llama model placed on the GPU
#   golden  SmolLM2-135M Q4_1 against tests/golden with every layer on the GPU (logits,
#           greedy, perplexity) and with a partial offload
#   bench   pp512 / tg128 tokens/s (llama-bench style, median of 3) as JSON, with where a
#           decode token's time goes (GPU graph, host, waiting); again without PDL; then
#           `ggmlpy bench -ngl 99` as a user runs it (the host part on the CPU backend, or
#           on the reference backend where this machine's llvmlite cannot run it)
#   synth   the same benchmark on random weights with SmolLM2's shapes (no model file needed)
#   variants  synth under each setting worth comparing: default, GGMLPY_CUDA_FUSE_OPROJ=1
#           (the output projection inside the decode attention: 125 launches a token, not
#           154), GGMLPY_CUDA_PDL=0, GGMLPY_CUDA_MATVEC_ROWS=1 and 2, GGMLPY_CUDA_ATTN_THREADS=256
#   summary the headline numbers of every JSON and log so far, as one small JSON
#
#   bench/cuda_device_check.sh [stage ...]      (default: env tests golden bench summary)
#
# Filling .device/cache before a session (no GPU needed; about 4 minutes on 2 cores):
#   export GGMLPY_CACHE=$PWD/.device/cache; M=<SmolLM2 gguf>
#   python bench/bench_cuda.py --model $M --prebuild -n 8
#   for r in 0 1 2; do GGMLPY_CUDA_MATVEC_ROWS=$r python bench/bench_cuda.py --synthetic smollm2 --prebuild -n 8; done
#   GGMLPY_CUDA_PREBUILD=1 python -m pytest -q tests/ggmlpy/codegen_cuda -k "not emu"   (fails by design: it only compiles)
# (bench/cuda_prebuild.sh runs these three steps.)
# One GPU session with the model in two halves (each call carries at most 64 MiB):
#   run 1, carry .device/cache .device/parts1:  env variants tests summary
#   run 2 (within the machine's warm window), carry .device/parts2:  golden bench summary
#
# What the machine lacks travels in .device/ (ignored by git): cache/ (kernels compiled
# ahead of time: GGMLPY_CACHE) and the model file, whole in models/
# or in pieces in parts*/ (NAME.partNN plus NAME.sha256 with the whole file's hash and the
# number of pieces). Everything is copied to a stash
# outside the checkout, so pieces carried by separate calls on the same machine add up.
# Each stage has its own time limit and the script goes on after a failing stage.
set -u
cd "$(dirname "$0")/.."
DEV=${GGMLPY_DEVICE_DIR:-.device}
STASH=${GGMLPY_DEVICE_STASH:-/tmp/ggmlpy-device}
MODEL=SmolLM2-135M-Instruct.Q4_1.gguf
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export GGMLPY_CACHE=$STASH/cache GGMLPY_MODELS=$STASH/models
LOGS=${OUT:-$STASH/out}
mkdir -p "$STASH"/cache "$STASH"/models "$STASH"/parts "$LOGS"
[ -d "$DEV/cache" ] && cp -r "$DEV/cache/." "$STASH/cache/"
[ -d "$DEV/models" ] && cp "$DEV/models/"* "$STASH/models/" 2>/dev/null
for d in "$DEV"/parts*; do [ -d "$d" ] && cp "$d"/* "$STASH/parts/"; done

stage() { echo; echo "=== $1 ($(date +%T))"; }
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE"

assemble_model() {
    local target=$GGMLPY_MODELS/$MODEL
    [ -f "$target" ] && return 0
    [ -f "$STASH/parts/$MODEL.sha256" ] || return 1
    local want n have
    want=$(cut -d' ' -f1 "$STASH/parts/$MODEL.sha256")
    n=$(cut -d' ' -f2 "$STASH/parts/$MODEL.sha256")
    have=$(ls "$STASH/parts/$MODEL".part* 2>/dev/null | wc -l)
    if [ "$have" != "$n" ]; then echo "model: $have of $n pieces here"; return 1; fi
    cat "$STASH/parts/$MODEL".part* > "$target.tmp"
    if [ "$(sha256sum "$target.tmp" | cut -d' ' -f1)" != "$want" ]; then
        echo "model: assembled file has the wrong sha256"; rm -f "$target.tmp"; return 1
    fi
    mv "$target.tmp" "$target" && echo "model: assembled $target"
}

bench_run() {  # bench_run LABEL OUTFILE TIMEOUT ARGS...: one bench_cuda.py report appended to OUTFILE
    local label=$1 out=$2 limit=$3
    shift 3
    echo "--- $label"
    timeout -k 5 "$limit" python3 bench/bench_cuda.py --label "$label" --reps 3 "$@" > "$out.part" 2> "$out.err"
    echo "rc=$? $(tail -3 "$out.err" | tr '\n' ' ')"
    cat "$out.part" >> "$out"
    rm -f "$out.part" "$out.err"
}

for s in ${*:-env tests golden bench summary}; do
    case $s in
    env)
        stage env
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
        nvcc --version | tail -2
        python3 -c "import sys, numpy, jinja2; print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'jinja2', jinja2.__version__)"
        python3 -c "from importlib.metadata import version; print('cuda-bindings', version('cuda-bindings'))"
        python3 -c "import ggmlpy.codegen_cuda as c; print('cuda_available:', c.cuda_available())"
        python3 -c "from ggmlpy.codegen_cuda.nvcc import nvcc_version, find_nvcc; print('nvcc key:', nvcc_version(find_nvcc()))"
        [ -f "$GGMLPY_CACHE/NVCC_VERSION" ] && echo "prebuilt with: $(cat "$GGMLPY_CACHE/NVCC_VERSION")"
        echo "prebuilt kernel cache entries: $(find "$GGMLPY_CACHE" -name '*.cubin' | wc -l)"
        ;;
    tests)
        stage "tests/ggmlpy/codegen_cuda on the GPU"
        timeout -k 5 100 $PYTEST -k "not emu and not smollm2" --durations=5 tests/ggmlpy/codegen_cuda \
            2>&1 | tee "$LOGS/tests.log" | tail -25
        ;;
    golden)
        stage "SmolLM2 golden bars, all layers on the GPU and partially offloaded"
        if assemble_model; then
            timeout -k 5 140 $PYTEST -s -k smollm2 tests/ggmlpy/codegen_cuda/test_llama.py 2>&1 | tee "$LOGS/golden.log" \
                | grep -E "smollm2 |passed|failed|skipped|Error|assert" | tail -30
        else
            echo "skipped: the model file is not here"
        fi
        ;;
    bench)
        stage "speed, SmolLM2-135M Q4_1, -ngl 99"
        if assemble_model; then
            bench_run default "$LOGS/bench.json" 70 --model "$GGMLPY_MODELS/$MODEL"
            GGMLPY_CUDA_PDL=0 bench_run no-pdl "$LOGS/bench.json" 50 --model "$GGMLPY_MODELS/$MODEL"
            GGMLPY_CUDA_FUSE_OPROJ=1 bench_run fused-oproj "$LOGS/bench.json" 50 --model "$GGMLPY_MODELS/$MODEL"
            echo "--- ggmlpy bench -ngl 99"
            for be in "" "--backend ref"; do  # the CPU host backend needs this project's llvmlite
                if timeout -k 5 90 python3 -m ggmlpy bench -m "$GGMLPY_MODELS/$MODEL" -ngl 99 -r 3 \
                        --no-start-times $be > "$LOGS/ggmlpy_bench.json" 2> "$LOGS/ggmlpy_bench.err"; then
                    cat "$LOGS/ggmlpy_bench.json"; break
                fi
                echo "ggmlpy bench $be failed: $(tail -2 "$LOGS/ggmlpy_bench.err" | tr '\n' ' ')"
            done
        else
            echo "the model file is not here: random weights with its shapes instead"
            bench_run synth-default "$LOGS/bench_synth.json" 70 --synthetic smollm2
        fi
        ;;
    synth)
        stage "speed, random weights with SmolLM2's shapes, -ngl 99"
        bench_run synth-default "$LOGS/bench_synth.json" 70 --synthetic smollm2
        ;;
    variants)
        stage "speed, random weights with SmolLM2's shapes, each setting"
        bench_run synth-default "$LOGS/variants.json" 40 --synthetic smollm2
        GGMLPY_CUDA_FUSE_OPROJ=1 bench_run synth-oproj "$LOGS/variants.json" 30 --synthetic smollm2
        GGMLPY_CUDA_PDL=0 bench_run synth-no-pdl "$LOGS/variants.json" 30 --synthetic smollm2
        GGMLPY_CUDA_MATVEC_ROWS=1 bench_run synth-rows1 "$LOGS/variants.json" 30 --synthetic smollm2
        GGMLPY_CUDA_MATVEC_ROWS=2 bench_run synth-rows2 "$LOGS/variants.json" 30 --synthetic smollm2
        GGMLPY_CUDA_ATTN_THREADS=256 bench_run synth-attn256 "$LOGS/variants.json" 30 --synthetic smollm2
        ;;
    summary)
        stage summary
        python3 bench/bench_cuda.py --summarize "$LOGS"/variants.json "$LOGS"/bench.json "$LOGS"/bench_synth.json \
            --golden-log "$LOGS/golden.log" | tee "$LOGS/summary.json"
        ;;
    *)
        echo "unknown stage $s (env tests golden bench synth variants summary)"
        ;;
    esac
done
stage done
