# Source with the deps folder made by .ci/run: points NVRTC (library + headers) and Python at it.
deps="${1:-$PWD/.dev/ci}"
lib="$deps/nvrtc/nvidia/cu13/lib"
[ -e "$lib/libnvrtc.so" ] || ln -sf libnvrtc.so.13 "$lib/libnvrtc.so" 2>/dev/null || true
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export VOXTILE_CUDA_INCLUDE="$deps/nvrtc/nvidia/cu13/include"
export PYTHONPATH="$deps/py${PYTHONPATH:+:$PYTHONPATH}"
