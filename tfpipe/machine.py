"""The machine a process runs on, as the process may use it: the one definition of its cores.

`os.cpu_count()` counts the host's cores. A process pinned to fewer (taskset, a container's
cpuset) may run on only those, and a container's CPU quota (cgroups' `cpu.max`, or
`cpu.cfs_quota_us` in cgroups v1) lets it use only so many cores' time however many it may
run on. Thread pools, worker processes and batch threads sized from the host's count then
oversubscribe what the process has.
"""

from __future__ import annotations

import math
import os

CGROUP_ROOT = "/sys/fs/cgroup"


def quota_cores(cpu_max: str) -> int | None:
    """The whole cores a cgroups v2 `cpu.max` text ("QUOTA PERIOD", or "max PERIOD": no quota)
    allows, rounded up; None without a quota or for a text that is not one."""
    parts = cpu_max.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def _cgroup_quota(root: str = CGROUP_ROOT) -> int | None:
    """This process's cgroup CPU quota in whole cores, v2 then v1; None where there is none."""
    try:
        with open(os.path.join(root, "cpu.max")) as f:
            return quota_cores(f.read())
    except OSError:
        pass
    try:
        with open(os.path.join(root, "cpu", "cpu.cfs_quota_us")) as q, \
                open(os.path.join(root, "cpu", "cpu.cfs_period_us")) as p:
            return quota_cores(f"{q.read().strip()} {p.read().strip()}".replace("-1 ", "max "))
    except OSError:
        return None


def cores(root: str = CGROUP_ROOT) -> int:
    """The cores this process may use: those it may run on (its affinity), no more than its
    cgroup's CPU quota allows; at least 1."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        available = os.cpu_count() or 1
    quota = _cgroup_quota(root)
    return max(1, min(available, quota) if quota else available)
