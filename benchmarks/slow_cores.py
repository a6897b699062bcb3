"""Run a command as if on a machine whose cores are slower than this one's: on every core a busy
loop pinned to it takes the rest of each 10 ms at real-time priority (SCHED_FIFO), so whatever
the command runs there, one thread or several, gets SPEED of that core. What the command waits
on (sleeps, timeouts, the network) is not slowed; what it computes is, which is what a slower
CPU does. Unlike a slower CPU, it stalls for up to (1 - SPEED) x 10 ms at a time: a latency
measured under it is not a slower machine's.

    sudo python benchmarks/slow_cores.py --speed 0.625 -- pytest -q

The main suite's time on the slower 2-core machines (AVX2 only) is the use: at --speed 0.625 the
cores do the suite's work 1.6 times slower. Real-time priority needs root (CAP_SYS_NICE); without
it the script says so and exits 2. It prints the command's wall time and exits with its code.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing
import os
import signal
import subprocess
import sys
import time

PERIOD_S = 0.010
PR_SET_PDEATHSIG = 1


def _take(core: int, busy: float, ready) -> None:
    """Spin for `busy` seconds of every PERIOD_S on `core`, at real-time priority; killed with the
    script, however it ends (a real-time loop left behind would slow the machine for good)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    os.sched_setaffinity(0, {core})
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except PermissionError:
        ready.send(False)
        return
    ready.send(True)
    due = time.monotonic()
    while True:
        until = due + busy
        while time.monotonic() < until:
            pass
        due += PERIOD_S
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        else:  # behind (the kernel's real-time limit held us): start a new period now
            due = time.monotonic()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speed", type=float, default=0.625,
                        help="the share of each core the command keeps (default 0.625: 1.6x slower)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    if not 0 < args.speed < 1:
        parser.error("--speed is a share of a core, between 0 and 1")
    cores = sorted(os.sched_getaffinity(0))
    takers = []
    try:
        for core in cores:
            mine, theirs = multiprocessing.Pipe(duplex=False)
            taker = multiprocessing.Process(target=_take, args=(core, PERIOD_S * (1 - args.speed), theirs),
                                            daemon=True)
            taker.start()
            takers.append(taker)
            if not mine.recv():
                print("slow_cores: real-time priority refused (run as root, or with CAP_SYS_NICE)", file=sys.stderr)
                return 2
        print(f"slow_cores: {len(cores)} cores, each keeping {args.speed:g} for the command", file=sys.stderr,
              flush=True)
        started = time.monotonic()
        code = subprocess.call(command)
        print(f"slow_cores: exit {code} after {time.monotonic() - started:.1f} s", file=sys.stderr)
        return code
    finally:
        for taker in takers:
            taker.kill()
            taker.join()


if __name__ == "__main__":
    sys.exit(main())
