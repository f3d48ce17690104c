# shellcheck shell=bash
# Sourced on the GPU machine (no CUDA toolkit needed): finds the directories of the NVIDIA libraries that the
# library test programs (tests/programs: cublas_gemm, cudnn_conv, nccl_allreduce, cusparse_ilu) load — cuBLAS,
# cuDNN 9 and its sub-libraries, NCCL, NVRTC (cuDNN's runtime-compiled engines), cuSPARSE with nvJitLink — and
# exports them, colon-joined, as VCUDA_GPU_LIB_PATH. Prints one line: `info: VCUDA_GPU_LIB_PATH=... [missing: ...]`.
#
#   . tests/gpu/find_libs.sh && LD_LIBRARY_PATH="$VCUDA_GPU_LIB_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" prog
#
# Where it looks, first hit of each library wins: the Python `nvidia` packages that PyTorch's pip install
# brings (nvidia/cu13/lib, nvidia/cudnn/lib, nvidia/nccl/lib, ...), torch/lib, /usr/local/cuda*/lib64 (and
# targets/*/lib), /usr/lib/x86_64-linux-gnu; then, for what is still missing, one `find /`.
# Returns 0 when every library was found, 1 otherwise (VCUDA_GPU_LIB_MISSING names those not found); the
# variable holds the directories found either way. Safe under `set -u`; sets no shell options.

vcuda_find_libs() {
    local wanted=(
        libcublas.so.13 libcublasLt.so.13
        libcudnn.so.9 libcudnn_graph.so.9 libcudnn_ops.so.9 libcudnn_cnn.so.9 libcudnn_adv.so.9
        libcudnn_heuristic.so.9 libcudnn_engines_precompiled.so.9 libcudnn_engines_runtime_compiled.so.9
        libnccl.so.2
        libnvrtc.so.13
        libcusparse.so.12 libnvJitLink.so.13
    )
    local py roots=() root lib dir hit
    local -A where=()

    # Roots: the Python packages first (what PyTorch itself loads), then the toolkit and system directories.
    for py in python3 python; do
        command -v "$py" >/dev/null 2>&1 || continue
        # `nvidia` is a namespace package (no __file__ in recent wheels): its __path__ lists every copy.
        while IFS= read -r root; do
            [ -n "$root" ] && roots+=("$root")
        done < <("$py" - 2>/dev/null <<'EOF'
import importlib.util, os
try:
    import nvidia
    for p in nvidia.__path__:
        print(p)
except Exception:
    pass
spec = importlib.util.find_spec("torch")
if spec is not None and spec.origin:
    print(os.path.join(os.path.dirname(spec.origin), "lib"))
EOF
        )
        break
    done
    for root in /usr/local/cuda /usr/local/cuda-*; do
        [ -d "$root" ] || continue
        roots+=("$root/lib64")
        for dir in "$root"/targets/*/lib; do
            [ -d "$dir" ] && roots+=("$dir")
        done
    done
    roots+=(/usr/lib/x86_64-linux-gnu /usr/lib64)

    for root in "${roots[@]}"; do
        [ -d "$root" ] || continue
        for lib in "${wanted[@]}"; do
            [ -n "${where[$lib]:-}" ] && continue
            hit=$(find -H "$root" -maxdepth 4 -name "$lib" \( -type f -o -type l \) -print -quit 2>/dev/null)
            [ -n "$hit" ] && where[$lib]=$(dirname "$hit")
        done
    done

    # The last resort: one walk of the whole file system for what is still missing.
    local expr=()
    for lib in "${wanted[@]}"; do
        [ -n "${where[$lib]:-}" ] && continue
        [ ${#expr[@]} -gt 0 ] && expr+=(-o)
        expr+=(-name "$lib")
    done
    if [ ${#expr[@]} -gt 0 ]; then
        while IFS= read -r hit; do
            lib=$(basename "$hit")
            [ -z "${where[$lib]:-}" ] && where[$lib]=$(dirname "$hit")
        done < <(find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o \
                      \( "${expr[@]}" \) \( -type f -o -type l \) -print 2>/dev/null)
    fi

    # Colon-join the directories in the order of `wanted`, each once.
    local path="" missing=""
    for lib in "${wanted[@]}"; do
        dir=${where[$lib]:-}
        if [ -z "$dir" ]; then
            missing+="${missing:+ }$lib"
            continue
        fi
        case ":$path:" in
            *":$dir:"*) ;;
            *) path+="${path:+:}$dir" ;;
        esac
    done
    export VCUDA_GPU_LIB_PATH="$path"
    export VCUDA_GPU_LIB_MISSING="$missing"
    echo "info: VCUDA_GPU_LIB_PATH=${path:-(none)}${missing:+ [missing: $missing]}"
    [ -z "$missing" ]
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    echo "find_libs.sh: source it (. tests/gpu/find_libs.sh) so that VCUDA_GPU_LIB_PATH reaches your shell" >&2
    vcuda_find_libs
    exit $?
fi
vcuda_find_libs
