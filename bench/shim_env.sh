# shellcheck shell=bash
# Sourced by bench/run.sh and bench/overhead.sh: the environment of a shimmed benchmark run.
#   shim_env MIB LOG [PROFILE [TRACE]]
# prints `env` and the settings (LIB: the library to preload, set by the caller): budget MIB MiB,
# log LOG, the profile PROFILE (empty: none, the run is reactive), the run trace TRACE (empty:
# none). With FAKE=1 only `env` (nothing is preloaded).
shim_env() {
    local mib=$1 log=$2 prof=${3:-} trace=${4:-}
    if [ "${FAKE:-0}" = 1 ]; then
        echo env
        return
    fi
    # REMAP_SAFETY=tracked: strict (the default) synchronizes the whole device at every move, so
    # no prefetch could overlap compute; tracked waits only for the launches that used the
    # allocation, which is safe here because the model keeps no pointers in device memory.
    echo env LD_PRELOAD="$LIB" FLEXTENSOR_GPU_MEMORY_LIMIT="${mib}MiB" \
        FLEXTENSOR_REMAP_SAFETY=tracked FLEXTENSOR_LOG_LEVEL=info FLEXTENSOR_LOG_FILE="$log" \
        ${prof:+FLEXTENSOR_PROFILE="$prof"} ${trace:+FLEXTENSOR_TRACE_OUT="$trace"}
}
