"""Run a command as if on a machine whose cores are slower than this one's: every core is shared
with a busy loop pinned to it, in a sibling cgroup, at the weights that leave the command SPEED
of each core while it keeps every core busy. What the command waits on (sleeps, timeouts, the
network) is not slowed; what it computes is, which is what a slower CPU does. One limit: the
kernel gives a cgroup's weight to the cores its threads run on, so while the command runs on one
core only, it gets more of that core (0.77 at SPEED 0.625 on 2 cores): an estimate from below.

    sudo python benchmarks/slow_cores.py --speed 0.625 -- pytest -q

The main suite's time on the slower 2-core machines (AVX2 only) is the use: at --speed 0.625 the
cores do the suite's work 1.6 times slower. It needs root and cgroup v1's cpu controller at
/sys/fs/cgroup/cpu (the cpu.shares weights); where there is none it says so and exits 2. It
prints the command's wall time and exits with the command's exit code.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time

CPU = "/sys/fs/cgroup/cpu"
HOG_WEIGHT = 1024


def weights(speed: float) -> tuple[int, int]:
    """(the command's cpu.shares, the busy loops' cpu.shares): speed = mine / (mine + theirs)."""
    return round(HOG_WEIGHT * speed / (1 - speed)), HOG_WEIGHT


def _spin(core: int) -> None:
    os.sched_setaffinity(0, {core})  # one per core: the balancer must not gather them on one
    while True:
        pass


def _group(name: str, shares: int) -> str:
    path = os.path.join(CPU, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "cpu.shares"), "w") as f:
        f.write(str(shares))
    return path


def _join(group: str) -> None:
    with open(os.path.join(group, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speed", type=float, default=0.625,
                        help="the share of each core the command gets when both want it (default 0.625: 1.6x slower)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    if not 0 < args.speed < 1:
        parser.error("--speed is a share of a core, between 0 and 1")
    if not os.access(os.path.join(CPU, "cpu.shares"), os.W_OK):
        print(f"slow_cores: no writable cgroup v1 cpu controller at {CPU} (root and cgroup v1 needed)",
              file=sys.stderr)
        return 2
    mine, theirs = weights(args.speed)
    suffix = str(os.getpid())
    command_group, hog_group = _group(f"slow-cores-cmd-{suffix}", mine), _group(f"slow-cores-hog-{suffix}", theirs)
    cores = sorted(os.sched_getaffinity(0))
    hogs = []
    try:
        for core in cores:
            hog = multiprocessing.Process(target=_spin, args=(core,), daemon=True)
            hog.start()
            with open(os.path.join(hog_group, "cgroup.procs"), "w") as f:
                f.write(str(hog.pid))
            hogs.append(hog)
        print(f"slow_cores: {len(cores)} busy loops; the command gets {args.speed:g} of a core when both want it",
              file=sys.stderr, flush=True)
        started = time.monotonic()
        code = subprocess.call(command, preexec_fn=lambda: _join(command_group))
        print(f"slow_cores: exit {code} after {time.monotonic() - started:.1f} s", file=sys.stderr)
        return code
    finally:
        for hog in hogs:
            hog.kill()
            hog.join()
        for group in (command_group, hog_group):
            try:
                os.rmdir(group)
            except OSError as e:  # a process of the command's is still in it
                print(f"slow_cores: {group} left behind: {e}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
