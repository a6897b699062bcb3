"""What both APIs call: find the servable, check the request, run it (batched or not) off
the event loop."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from serve.batcher import BatchScheduler
from serve.manager import ModelManager
from serve.servable import Servable, Signature


class Inference:
    def __init__(self, manager: ModelManager, executor: ThreadPoolExecutor, batcher: BatchScheduler | None = None):
        self.manager, self.executor, self.batcher = manager, executor, batcher

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def predict(self, name: str, version: int | None, label: str | None, signature_name: str,
                      inputs: dict[str, np.ndarray], output_filter=()) -> tuple[Servable, Signature, dict]:
        return await self.predict_on(self.manager.resolve(name, version, label), signature_name, inputs,
                                     output_filter)

    async def predict_on(self, servable: Servable, signature_name: str, inputs: dict[str, np.ndarray],
                         output_filter=()) -> tuple[Servable, Signature, dict]:
        sig = servable.signature(signature_name)
        checked = servable.check_inputs(sig, inputs)
        keep = servable.output_filter(sig, output_filter)
        if self.batcher is not None and _batchable(checked):
            key = (id(servable), sig.name, tuple((k, v.dtype.str, v.shape[1:]) for k, v in sorted(checked.items())))
            outputs = await self.batcher.submit(key, lambda merged: servable.run(sig, merged), checked)
            if keep:
                outputs = {k: outputs[k] for k in keep}
        else:
            outputs = await self._call(servable.run, sig, checked, keep)
        return servable, sig, outputs

    async def classify(self, name, version, label, signature_name: str, examples: list[bytes]):
        servable = self.manager.resolve(name, version, label)
        sig, classes, scores = await self._call(servable.classify, signature_name, examples)
        return servable, sig, classes, scores

    async def regress(self, name, version, label, signature_name: str, examples: list[bytes]):
        servable = self.manager.resolve(name, version, label)
        sig, values = await self._call(servable.regress, signature_name, examples)
        return servable, sig, values


def _batchable(inputs: dict[str, np.ndarray]) -> bool:
    """Every input has a batch dimension of the same, non-zero size."""
    sizes = {v.shape[0] if v.ndim else None for v in inputs.values()}
    return len(sizes) == 1 and None not in sizes and 0 not in sizes
