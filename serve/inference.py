"""What both APIs call: find the servable, check the request, run it, batched or not.

gRPC handlers run on the gRPC server's threads (`--grpc_max_threads`) and call the
blocking methods. The REST API lives on the asyncio loop and calls the `*_async` ones,
which never run TensorFlow on the loop: a model call goes to a REST worker thread
(`--rest_api_num_threads`), or to a batch thread when batching is on.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from serve.batcher import BatchScheduler
from serve.manager import ModelManager
from serve.servable import Servable, Signature


class Inference:
    def __init__(self, manager: ModelManager, batcher: BatchScheduler | None = None,
                 executor: ThreadPoolExecutor | None = None):
        self.manager, self.batcher, self.executor = manager, batcher, executor

    # ---- blocking: called on the caller's thread -------------------------------------

    def predict(self, name: str, version: int | None, label: str | None, signature_name: str,
                inputs: dict[str, np.ndarray], output_filter=()) -> tuple[Servable, Signature, dict]:
        servable = self.manager.resolve(name, version, label)
        sig, checked, keep = _prepare(servable, signature_name, inputs, output_filter)
        future = self._submit(servable, sig, checked)
        outputs = servable.run(sig, checked, keep) if future is None else _keep(future.result(), keep)
        return servable, sig, outputs

    def classify(self, name, version, label, signature_name: str, examples: list[bytes]):
        servable = self.manager.resolve(name, version, label)
        sig, classes, scores = servable.classify(signature_name, examples, self._runner(servable))
        return servable, sig, classes, scores

    def regress(self, name, version, label, signature_name: str, examples: list[bytes]):
        servable = self.manager.resolve(name, version, label)
        sig, values = servable.regress(signature_name, examples, self._runner(servable))
        return servable, sig, values

    # ---- asyncio: the REST API --------------------------------------------------------

    async def predict_async(self, servable: Servable, signature_name: str, inputs: dict[str, np.ndarray],
                            output_filter=()) -> tuple[Servable, Signature, dict]:
        sig, checked, keep = _prepare(servable, signature_name, inputs, output_filter)
        future = self._submit(servable, sig, checked)
        if future is None:
            outputs = await asyncio.get_running_loop().run_in_executor(self.executor, servable.run, sig, checked, keep)
        else:  # waits without holding a thread
            outputs = _keep(await asyncio.wrap_future(future), keep)
        return servable, sig, outputs

    async def classify_async(self, name, version, label, signature_name: str, examples: list[bytes]):
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, self.classify, name, version, label, signature_name, examples)

    async def regress_async(self, name, version, label, signature_name: str, examples: list[bytes]):
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, self.regress, name, version, label, signature_name, examples)

    # ---- batching ----------------------------------------------------------------------

    def _submit(self, servable: Servable, sig: Signature, checked: dict[str, np.ndarray]):
        """The batch queue's future for this request, or None when it runs unbatched."""
        if self.batcher is None or not _batchable(checked):
            return None
        key = (id(servable), sig.name, tuple((k, v.dtype.str, v.shape[1:]) for k, v in sorted(checked.items())))
        return self.batcher.submit(key, lambda merged: servable.run(sig, merged), checked)

    def _runner(self, servable: Servable):
        """How Classify and Regress call their signature: through the batch queue when on."""
        def run(sig: Signature, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            future = self._submit(servable, sig, inputs)
            return servable.run(sig, inputs) if future is None else future.result()
        return run


def _prepare(servable: Servable, signature_name: str, inputs: dict[str, np.ndarray], output_filter):
    sig = servable.signature(signature_name)
    return sig, servable.check_inputs(sig, inputs), servable.output_filter(sig, output_filter)


def _keep(outputs: dict[str, np.ndarray], keep: list[str] | None) -> dict[str, np.ndarray]:
    return {k: outputs[k] for k in keep} if keep else outputs


def _batchable(inputs: dict[str, np.ndarray]) -> bool:
    """Every input has a batch dimension of the same, non-zero size."""
    sizes = {v.shape[0] if v.ndim else None for v in inputs.values()}
    return len(sizes) == 1 and None not in sizes and 0 not in sizes
