"""What a server process sets about its own memory and garbage collection, once: glibc's malloc
made to give large freed blocks back (`tune_malloc`), and the objects TensorFlow and Keras leave
at import frozen out of the collector's reach (`freeze_import_time_objects`)."""

from __future__ import annotations

import ctypes
import gc
import os

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc malloc.h)


def tune_malloc(nbytes: int = 128 * 1024) -> None:
    """Keep glibc serving blocks over `nbytes` (its own starting threshold) from mmap, so that
    freed ones go straight back to the OS; by default glibc raises the threshold as large
    blocks are freed, after which they come from the heap and stay resident. An explicit
    MALLOC_MMAP_THRESHOLD_ wins. The number of arenas is left to glibc (eight per core):
    MALLOC_ARENA_MAX=2 keeps RSS flatter across hot reloads and costs throughput (docs/benchmarks.md)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, nbytes)
    except (OSError, AttributeError):  # not glibc
        pass


def freeze_import_time_objects() -> None:
    """TensorFlow and Keras leave hundreds of thousands of long-lived objects; a full garbage
    collection that walks them stalls every thread, which shows in the latency's far tail. Frozen,
    they are never walked; the models loaded later stay collectable. TFPIPE_GC_FREEZE=0 leaves them
    unfrozen (benchmarks/bench_serve.py shows the difference)."""
    if os.environ.get("TFPIPE_GC_FREEZE", "1") != "0":
        gc.collect()
        gc.freeze()
