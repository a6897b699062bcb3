"""GPU utilisation and memory sampled with NVML while training, so "is the GPU starved?"
has a measured answer: per-epoch means in TensorBoard, mean and p10 in train.json."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf


def nvml_handles(tf_gpus: list[dict[str, Any]]):
    """NVML handles for the GPUs TensorFlow uses. NVML numbers every GPU on the machine;
    TensorFlow numbers only those CUDA_VISIBLE_DEVICES shows, so map through it."""
    import pynvml

    pynvml.nvmlInit()
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    handles = []
    for g in tf_gpus:
        tf_index = int(g["device"].rsplit(":", 1)[-1])
        target = visible[tf_index] if tf_index < len(visible) else str(tf_index)
        if target.startswith(("GPU-", "MIG-")):
            handles.append(pynvml.nvmlDeviceGetHandleByUUID(target))
        else:
            handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(target)))
    return handles


class GpuSampler(keras.callbacks.Callback):
    """Samples every `interval` seconds in a thread; writes per-epoch means to TensorBoard."""

    def __init__(self, tf_gpus: list[dict[str, Any]], log_dir: str, interval: float = 0.25):
        super().__init__()
        import pynvml

        self._nvml = pynvml
        self._handles = nvml_handles(tf_gpus)
        self._interval = interval
        self._samples: list[tuple[float, int, float, float]] = []  # time, gpu, util %, memory GiB
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._writer = tf.summary.create_file_writer(os.path.join(log_dir, "gpu"))
        self._epoch_start = 0.0

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            now = time.perf_counter()
            for i, h in enumerate(self._handles):
                util = self._nvml.nvmlDeviceGetUtilizationRates(h).gpu
                used = self._nvml.nvmlDeviceGetMemoryInfo(h).used / 2**30
                self._samples.append((now, i, float(util), used))

    def on_train_begin(self, logs=None):
        self._thread.start()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        recent = [s for s in list(self._samples) if s[0] >= self._epoch_start]
        with self._writer.as_default(step=epoch):
            for i in range(len(self._handles)):
                mine = [s for s in recent if s[1] == i]
                if mine:
                    tf.summary.scalar(f"gpu{i}/utilization_percent", float(np.mean([s[2] for s in mine])))
                    tf.summary.scalar(f"gpu{i}/memory_used_gib", max(s[3] for s in mine))

    def on_train_end(self, logs=None):
        self._stop.set()

    def summary(self) -> list[dict[str, Any]]:
        """Per GPU: mean and 10th-percentile utilisation, peak memory, sample count."""
        self._stop.set()
        out = []
        for i in range(len(self._handles)):
            util = np.array([s[2] for s in self._samples if s[1] == i])
            mem = [s[3] for s in self._samples if s[1] == i]
            out.append({"gpu": i, "samples": int(len(util)),
                        "utilization_mean": round(float(util.mean()), 1) if len(util) else None,
                        "utilization_p10": round(float(np.percentile(util, 10)), 1) if len(util) else None,
                        "memory_peak_gib": round(max(mem), 2) if mem else None})
        return out
