"""What hardware is here, and the precision, XLA and distribution strategy to use on it."""

from __future__ import annotations

import json
import os
from typing import Any

import tensorflow as tf

from tfpipe.train.errors import TrainError


def setup_gpus(log_placement: bool) -> list[dict[str, Any]]:
    """Turn on memory growth (TF must not grab all GPU memory up front) and describe the GPUs.
    CUDA_VISIBLE_DEVICES is honoured by TensorFlow itself: hidden GPUs are never listed."""
    tf.debugging.set_log_device_placement(log_placement)
    gpus = []
    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:
            pass  # already initialised (a second run in the same process)
        details = tf.config.experimental.get_device_details(gpu)
        cc = details.get("compute_capability")
        gpus.append({
            "device": gpu.name,
            "name": details.get("device_name", "GPU"),
            "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
            "memory_gb": _gpu_memory_gb(gpu),
        })
    return gpus


def _gpu_memory_gb(gpu) -> float | None:
    try:
        import pynvml

        from tfpipe.train.gpu_monitor import nvml_handles

        handle = nvml_handles([{"device": gpu.name}])[0]
        return round(pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30, 1)
    except Exception:  # no NVML library (no NVIDIA driver): memory stays unknown
        return None


# The x86 instruction sets that decide how fast float32, bfloat16 and float16 arithmetic is on a CPU.
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8",
                "amx_tile")


def cpu_features(cpuinfo: str = "/proc/cpuinfo") -> dict[str, Any]:
    """The CPU's model name and which of CPU_FEATURES it has (empty where /proc/cpuinfo is absent)."""
    try:
        with open(cpuinfo) as f:
            text = f.read()
    except OSError:
        return {"model": None, "features": []}
    model, flags = None, set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model is None:
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return {"model": model, "features": [f for f in CPU_FEATURES if f in flags]}


def choose_precision(requested: str, gpus: list[dict[str, Any]]) -> tuple[str, str]:
    """(policy name, why)."""
    if requested != "auto":
        why = "as requested"
        if not gpus and requested != "float32":
            why += " (on a CPU: runs, but slower than float32)"
        return requested, why
    if not gpus:
        return "float32", "no GPU"
    ccs = [float(g["compute_capability"] or 0) for g in gpus]
    if min(ccs) >= 7.0:
        return "mixed_float16", f"NVIDIA GPU(s) with compute capability {min(ccs):g} >= 7.0 (tensor cores)"
    return "float32", f"compute capability {min(ccs):g} < 7.0: no fast float16"


def choose_xla(requested: str, gpus: list[dict[str, Any]]) -> tuple[bool, str]:
    if requested == "on":
        return True, "as requested"
    if requested == "off":
        return False, "as requested"
    if gpus:
        return True, "GPU: XLA fuses the layers' kernels"
    return False, "CPU: XLA compile time outweighs its gain here (see benchmarks/bench_train.py)"


def choose_strategy(requested: str, gpus: list[dict[str, Any]]) -> tuple[tf.distribute.Strategy, str]:
    if requested == "multiworker":
        if "TF_CONFIG" not in os.environ:
            raise TrainError("--strategy multiworker needs TF_CONFIG describing the cluster and this task")
        try:
            json.loads(os.environ["TF_CONFIG"])
        except ValueError:
            raise TrainError("TF_CONFIG is not valid JSON") from None
        return tf.distribute.MultiWorkerMirroredStrategy(), "MultiWorkerMirroredStrategy (TF_CONFIG)"
    if requested == "mirrored" or (requested == "auto" and len(gpus) > 1):
        return tf.distribute.MirroredStrategy(), f"MirroredStrategy over {max(1, len(gpus))} device(s)"
    return tf.distribute.get_strategy(), "default strategy (one device)"


def worker_position(strategy: tf.distribute.Strategy) -> tuple[int, int]:
    """(number of workers, this worker's index): 1, 0 outside multi-worker training."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return 1, 0
    spec = resolver.cluster_spec().as_dict()
    workers = len(spec.get("worker", [])) + len(spec.get("chief", []))
    index = resolver.task_id + (1 if resolver.task_type == "worker" and "chief" in spec else 0)
    return workers, index
