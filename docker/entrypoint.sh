#!/bin/sh
# The image's entrypoint: thread counts from the container's CPU quota, then the command (uvicorn by default).
# torch and OpenMP otherwise start one thread per host core, however few CPUs `--cpus` grants the container,
# and the oversubscribed threads slow every request. A value set with -e wins.
set -eu

# The CPU quota in whole CPUs (rounded up), at most the CPUs this process may run on; cgroup v2 or v1.
cpus() {
    n=$(nproc)
    quota=max period=100000
    if [ -r /sys/fs/cgroup/cpu.max ]; then
        read -r quota period < /sys/fs/cgroup/cpu.max
    elif [ -r /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
        quota=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us)
        period=$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)
    fi
    if [ "$quota" != max ] && [ "$quota" -gt 0 ]; then
        q=$(((quota + period - 1) / period))
        if [ "$q" -lt "$n" ]; then n=$q; fi
    fi
    echo "$n"
}

n=$(cpus)
export GRPO_LENS_TORCH_THREADS="${GRPO_LENS_TORCH_THREADS:-$n}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$n}"
exec "$@"
