# shellcheck shell=bash
# Sourced by bench/run.sh and bench/overhead.sh: the environment of a shimmed benchmark run.

# pin_cpus SCRIPT: PIN, the command prefix that runs a process on the cores CPUS lists (empty
# when CPUS is not set); status 2, said on stderr in SCRIPT's name, when taskset refuses the list.
# The prefix goes before the run's `env`, so that only python gets the preloads.
pin_cpus() {
    PIN=()
    [ -n "${CPUS:-}" ] || return 0
    if ! taskset -c "$CPUS" true 2>/dev/null; then
        echo "$1: CPUS=$CPUS is not a CPU list taskset accepts (e.g. CPUS=4-11)" >&2
        return 2
    fi
    PIN=(taskset -c "$CPUS")
}

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
