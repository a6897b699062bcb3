"""The serving core: what both transports call, each call resolving its servable once.

REST (rest_api.py) and gRPC (grpc_api.py) only translate: they decode a request into a model
spec, a signature name and inputs (serve/codecs/), call one method here, and encode
what it returns. Here a request meets the manager (which version), the servable (which
signature, checked inputs, the model call) and the batcher, as TF Serving's two transports
both call one predictor, classifier, regressor and metadata/status implementation.

Both transports live on the server's asyncio loop. `predict` never runs TensorFlow on the
loop: a model call goes to a worker thread (`--rest_api_num_threads` for REST,
`--grpc_max_threads` for gRPC), or to a batch thread when batching is on, and the loop waits
without holding a thread. `classify`, `regress` and `multi_inference` call the model the same
way (Servable's calls awaiting `_how`'s `run`); a large request's examples are read on a worker
thread, a small one's on the loop.

With batching off, a request of more rows than `call_rows` (--max_call_rows) is answered by
successive model calls of at most that many rows, each a call of its own for TensorFlow's thread
pools (and, for Predict, for the worker threads), so that other requests' calls run between
them: a large request, or a small one that TensorFlow's fill-out rule makes large, cannot hold
the model while the others wait. Rows are answered independently of each other, as batching
assumes too; a signature whose outputs are not one row per input row is called whole.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Executor

import numpy as np

from tfpipe.serve.core.batcher import BatchScheduler
from tfpipe.serve.core.batching import BatchOptions, batch_shapes, join_rows, row_parts
from tfpipe.serve.core.canary import Canary
from tfpipe.serve.core.examples import finished
from tfpipe.serve.core.large_requests import large_request
from tfpipe.serve.core.manager import ModelManager, ModelSpec
from tfpipe.serve.core.servable import CLASSIFY, DEFAULT_SIGNATURE, REGRESS, Servable, Signature
from tfpipe.serve.core.shadow import Shadow, classification_view
from tfpipe.serve.errors import ServingError, invalid, quoted, unimplemented

# A request larger than this is decoded (and a REST body parsed) on a worker thread rather than on
# the loop that every connection shares; a smaller one takes less time than the thread hop costs.
OFF_LOOP_BYTES = 64 * 1024


@dataclasses.dataclass
class Prediction:
    """A Predict's answer with what the transports log and echo: the version and signature used."""
    servable: Servable
    signature: Signature
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]

    def large_answer(self) -> bool:
        """Whether its outputs are over OFF_LOOP_BYTES: the transports then encode them on a worker
        thread, in pieces (a small request's answer may be large: TensorFlow's fill-out, a model
        whose outputs are larger than its inputs)."""
        size = 0
        for v in self.outputs.values():  # (a loop: a generator's calls cost every request)
            size += v.nbytes
        return size > OFF_LOOP_BYTES


class Inference:
    """`per_model_batching`: each version batches with its own batching_params.pbtxt (and
    without one, not at all), as --enable_per_model_batching_parameters does. `shadow`: with
    --shadow, Predict, Classify and Regress that name no version or label are handed to it once
    answered (it mirrors a share of them to the model's candidate, off the request's path).
    `canary`: with --canary, it picks the requests of that kind the candidate answers instead."""

    def __init__(self, manager: ModelManager, batcher: BatchScheduler | None = None,
                 executor: Executor | None = None, per_model_batching: bool = False,
                 shadow: Shadow | None = None, canary: Canary | None = None, call_rows: int = 0):
        self.manager, self.batcher, self.executor = manager, batcher, executor
        self.call_rows = call_rows  # the most rows of one unbatched model call; 0: no limit
        self.per_model_batching = per_model_batching
        self.shadow, self.canary = shadow, canary
        self._options: dict[int, BatchOptions | None] = {}

    # ---- Classify, Regress and MultiInference ----------------------------------------------

    async def classify(self, spec: ModelSpec, signature_name: str, decode: Callable[[], list[bytes]],
                       client: str | None = None, executor: Executor | None = None, decode_off_loop: bool = False):
        """A Classify: the request's examples (`decode()`) read, and classified with the model called
        as Predict calls it (in a batch, or on `executor`'s model calls: the transport's threads,
        the core's by default), waited for without holding a thread. `decode_off_loop`: the
        examples read (and converted, see examples.run_examples) on `executor`, for a request large
        enough to keep the loop from other connections. (servable, signature, examples, classes, scores)."""
        examples = await self._read(decode, executor, decode_off_loop)
        servable, sig, (classes, scores) = await self._on_examples(
            "classify", spec, client, examples, executor, decode_off_loop,
            lambda s, **how: s.classify(signature_name, examples, **how), classification_view)
        return servable, sig, examples, classes, scores

    async def regress(self, spec: ModelSpec, signature_name: str, decode: Callable[[], list[bytes]],
                      client: str | None = None, executor: Executor | None = None, decode_off_loop: bool = False):
        """A Regress, as `classify`. (servable, signature, examples, values)."""
        examples = await self._read(decode, executor, decode_off_loop)
        servable, sig, (values,) = await self._on_examples(
            "regress", spec, client, examples, executor, decode_off_loop,
            lambda s, **how: s.regress(signature_name, examples, **how), lambda values: {"outputs": values})
        return servable, sig, examples, values

    async def _read(self, decode: Callable, executor: Executor | None, off_loop: bool):
        """`decode()` on the loop, or on `executor` (the core's by default) for a large request."""
        if not off_loop:
            return decode()
        return await asyncio.get_running_loop().run_in_executor(executor or self.executor, decode)

    def _how(self, servable: Servable, executor: Executor | None, off_loop: bool) -> dict:
        """How a Classify or Regress of `servable` runs on the request's path (Servable.classify's
        `run` and `off_loop`): its model calls as Predict's, its examples read off the loop when large."""
        executor = executor or self.executor

        async def run(sig: Signature, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            loop = asyncio.get_running_loop()
            future = self._submit(servable, sig, inputs, loop)
            if future is None:
                return await self._unbatched(servable, sig, inputs, None, executor, loop)
            return await future

        def elsewhere(fn, *args):
            return asyncio.get_running_loop().run_in_executor(executor, fn, *args)
        return {"run": run, "off_loop": elsewhere if off_loop else None}

    async def _on_examples(self, api: str, spec: ModelSpec, client: str | None, examples: list[bytes],
                           executor: Executor | None, off_loop: bool, call, view):
        """A Classify or Regress: `await call(servable, run=..., off_loop=...)` answers (signature,
        *result), `view(*result)` is the result as named outputs (what the canary checks and
        compares, and the shadow too). Returns the servable that answered, the signature and the result."""
        servable = self.manager.resolve(*spec)
        unversioned = spec.unversioned
        candidate = self.canary.pick(servable, client) if unversioned and self.canary is not None else None
        why = None
        if candidate is not None:
            try:
                t0 = time.perf_counter()
                sig, *result = await call(candidate, **self._how(candidate, executor, off_loop))
                why = self.canary.answered(servable, candidate, view(*result), time.perf_counter() - t0,
                                           lambda: view(*finished(call(servable))[1:]))  # on the canary's thread
            except Exception as e:  # noqa: BLE001 (whatever the candidate does, the served version answers)
                why = _failure(e)
            if why is None:
                return candidate, sig, result
        t0 = time.perf_counter()
        sig, *result = await call(servable, **self._how(servable, executor, off_loop))
        seconds = time.perf_counter() - t0
        if candidate is not None:
            self.canary.failed(servable, candidate, why, view(*result))
        elif unversioned:
            if self.canary is not None:
                self.canary.served(servable, seconds)
            if self.shadow is not None:
                self.shadow.examples(api, servable, sig.name, examples, tuple(result), seconds)
        return servable, sig, result

    async def multi_inference(self, tasks: Callable[[], list[tuple]], decode: Callable[[], list[bytes]],
                              executor: Executor | None = None, decode_off_loop: bool = False
                              ) -> tuple[Servable, list[tuple]]:
        """`tasks()`: (ModelSpec, signature name, method) per task, all of one model; `decode()`: the
        examples. Both read, checked as TF Serving checks them, and each task's signature run on
        the examples as `classify` runs one. Returns the servable and, per task,
        ('classify', classes, scores) or ('regress', values)."""
        tasks = tasks()
        examples = await self._read(decode, executor, decode_off_loop)
        servable = self._multi_inference_servable(tasks)
        how, results = self._how(servable, executor, decode_off_loop), []
        for _, signature_name, method in tasks:
            if method == CLASSIFY:
                results.append(("classify", *(await servable.classify(signature_name, examples, **how))[1:]))
            else:
                results.append(("regress", (await servable.regress(signature_name, examples, **how))[1]))
        return servable, results

    def _multi_inference_servable(self, tasks: list[tuple]) -> Servable:
        """The one servable a MultiInference's tasks name, each task checked as TF Serving checks it."""
        names = set()
        for (name, _, _), signature_name, _ in tasks:
            if not name:
                raise invalid("Found ModelSpec with an empty model name.")
            names.add(name)
        if len(names) > 1:
            raise invalid("All ModelSpecs in a MultiInferenceRequest must access the same model name.")
        servable = self.manager.resolve(*tasks[0][0])
        seen = set()
        for _, signature_name, method in tasks:
            key = signature_name or DEFAULT_SIGNATURE
            if key in seen:
                raise invalid(f"Duplicate evaluation of signature: {quoted(key)}")
            seen.add(key)
            if key not in servable.signatures:
                raise invalid(f"Requested signature not found in model graph: {quoted(key)}")
            if method == CLASSIFY:
                servable.classification_signature(key)
            elif method == REGRESS:
                servable.regression_signature(key)
            else:
                raise unimplemented(f"Unsupported signature method_name: {quoted(method)}")
        return servable

    # ---- what the transports call ---------------------------------------------------------

    async def predict(self, spec: ModelSpec, signature_name: str, decode: Callable[[Signature], dict[str, np.ndarray]],
                      output_filter=(), executor: Executor | None = None,
                      unknown_signature: Callable[[str], ServingError] | None = None,
                      client: str | None = None, decode_off_loop: bool = False,
                      rows: int | None = None) -> Prediction:
        """The one Predict: the servable resolved, its signature found, `decode(signature)` (the
        transport's codec; REST's JSON needs the signature's dtypes) giving the inputs, checked,
        run batched or on `executor` (the REST threads when None). `unknown_signature(key)`: the
        error for a key the SavedModel lacks, for a transport whose wording differs from
        FAILED_PRECONDITION's (REST's INVALID_ARGUMENT, as TF Serving's JSON decoding words it).
        `client`: the request's --canary_key value, if any. `decode_off_loop`: decode (and check)
        on the executor too, for a request large enough to keep the loop from other connections.
        `rows`: the rows the request declares, when the transport knows them before decoding: one
        that batching would refuse is refused before its tensors are built (TensorFlow's fill-out
        can make a small request's tensors large)."""
        servable = self.manager.resolve(*spec)
        unversioned = spec.unversioned
        options = self.batcher.options if self.batcher is not None and not self.per_model_batching else None
        if rows is not None and options is not None and rows > options.max_batch_size:
            raise invalid(f"Task size {rows} is larger than maximum input batch size {options.max_batch_size}")
        args = (signature_name, decode, output_filter, executor, unknown_signature, decode_off_loop)
        candidate = self.canary.pick(servable, client) if unversioned and self.canary is not None else None
        if candidate is not None:
            try:
                p, _, seconds = await self._predict_on(candidate, *args)

                def served_call() -> dict[str, np.ndarray]:  # on the canary's thread, for the agreement
                    sig = servable.signature(p.signature.name)
                    checked = servable.check_inputs(sig, decode(sig))
                    return servable.run(sig, checked, servable.output_filter(sig, output_filter))
                why = self.canary.answered(servable, candidate, p.outputs, seconds, served_call)
            except Exception as e:  # noqa: BLE001 (whatever the candidate does, the served version answers)
                why = _failure(e)
            if why is None:
                return p
            p, _, _ = await self._predict_on(servable, *args)  # raising: the request's own fault, not the candidate's
            self.canary.failed(servable, candidate, why, p.outputs)
            return p
        p, checked, seconds = await self._predict_on(servable, *args)
        if unversioned:
            if self.canary is not None:
                self.canary.served(servable, seconds)
            if self.shadow is not None:
                self.shadow.predict(servable, p.signature.name, checked, p.outputs, seconds)
        return p

    async def _predict_on(self, servable: Servable, signature_name: str, decode, output_filter, executor,
                          unknown_signature, decode_off_loop: bool = False
                          ) -> tuple[Prediction, dict[str, np.ndarray], float]:
        """`predict` on one servable: the Prediction, the checked inputs and the model call's seconds."""
        key = signature_name or DEFAULT_SIGNATURE
        if unknown_signature is not None and key not in servable.signature_defs:
            raise unknown_signature(key)
        sig = servable.signature(key)
        loop = asyncio.get_running_loop()

        def read() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
            inputs = decode(sig)
            return inputs, servable.check_inputs(sig, inputs)

        inputs, checked = await self._read(read, executor, decode_off_loop)
        keep = servable.output_filter(sig, output_filter)
        t0 = time.perf_counter()
        future = self._submit(servable, sig, checked, loop)
        if future is None:
            outputs = await self._unbatched(servable, sig, checked, keep, executor or self.executor, loop)
        else:  # waits without holding a thread
            outputs = _keep(await future, keep)
        return Prediction(servable, sig, inputs, outputs), checked, time.perf_counter() - t0

    async def _unbatched(self, servable: Servable, sig: Signature, inputs: dict[str, np.ndarray], keep,
                         executor: Executor, loop) -> dict[str, np.ndarray]:
        """`servable.run` on `executor`'s model calls (turns.Turns.calls, when it has them), in parts
        of at most `call_rows` rows, each part a job of its own (the thread is given back between
        parts)."""
        calls = getattr(executor, "calls", executor)
        parts = row_parts(inputs, self.call_rows) if sig.splits else None
        if parts is not None:
            with large_request():
                outputs = [await loop.run_in_executor(calls, servable.run, sig, part, keep) for part in parts]
                joined = await loop.run_in_executor(executor, _joined, sig, parts, outputs)  # (many rows: off the loop)
            if joined is not None:
                return joined
        return await loop.run_in_executor(calls, servable.run, sig, inputs, keep)

    # ---- batching ----------------------------------------------------------------------

    def batch_options(self, servable: Servable) -> BatchOptions | None:
        """The batching parameters this version uses; None: it runs unbatched."""
        if self.batcher is None:
            return None
        if not self.per_model_batching:
            return self.batcher.options
        if servable.uid not in self._options:
            p = servable.batching_params
            if p is None:
                self._options[servable.uid] = None
            else:
                self._options[servable.uid] = dataclasses.replace(  # the shared pool's size
                    BatchOptions.from_proto(p), num_batch_threads=self.batcher.options.num_batch_threads)
        return self._options[servable.uid]

    def forget(self, servable: Servable) -> None:
        """The version unloaded: its queues and cached options go."""
        self._options.pop(servable.uid, None)
        if self.batcher is not None:
            self.batcher.drop(servable.uid)

    def _submit(self, servable: Servable, sig: Signature, checked: dict[str, np.ndarray], loop=None):
        """The batch queue's future for this request (an asyncio.Future of `loop` when given), or
        None when it runs unbatched."""
        options = self.batch_options(servable)
        shapes = batch_shapes(checked) if options is not None else None
        if shapes is None:
            return None
        key = (servable.uid, sig.name, shapes)
        return self.batcher.submit(key, lambda merged: servable.run(sig, merged), checked, options, loop)


def _joined(sig: Signature, parts: list[dict], outputs: list[dict]) -> dict[str, np.ndarray] | None:
    """The parts' outputs as one call's; None, and the signature is not cut again, when an output
    is not one row per input row: then the caller calls it on the whole request."""
    joined = join_rows(outputs, [next(iter(p.values())).shape[0] for p in parts])
    if joined is None:
        sig.splits = False
    return joined


def _failure(e: Exception) -> str:
    """A candidate's failure as the canary records it."""
    if isinstance(e, ServingError):
        return f"{e.code.name}: {e.message}"
    return f"INTERNAL: {type(e).__name__}: {e}"


def _keep(outputs: dict[str, np.ndarray], keep: list[str] | None) -> dict[str, np.ndarray]:
    return {k: outputs[k] for k in keep} if keep else outputs
