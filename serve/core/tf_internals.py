"""Every private TensorFlow API the server uses, in one place.

TensorFlow's public API has no way to do these, and each is worth it (the reasons are beside
each one). A TensorFlow release may rename or reshape any of them: `check()` says which one
changed and what depends on it, and tests/test_tf_internals.py runs it, with each piece's
behaviour, on the installed TensorFlow. pyproject.toml pins the releases these were read
from (tensorflow < 2.22).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import ops

# Raw eager tensors from numpy arrays: EagerTensor(array, device name, dtype enum) skips
# tf.constant's conversion dispatch, a large part of a small request's cost (saved_model.flat_caller).
EagerTensor = ops.EagerTensor


class InternalsChanged(RuntimeError):
    """A private TensorFlow API the server relies on is gone or different."""


def device_name() -> str:
    """The eager context's current device, as EagerTensor's constructor takes it."""
    return context.context().device_name


def clear_kernel_cache() -> None:
    """Drop the kernels the eager context keeps for every function it ran, removed functions
    included: without it each unloaded model version's kernels stay in memory (manager.release)."""
    context.context().clear_kernel_cache()


def preflattened_call(concrete) -> Callable[[list], Any]:
    """A concrete function's call on its flat inputs (arguments then captures), without
    binding and checking structured arguments in Python (saved_model.flat_caller)."""
    return concrete._inference_function.call_preflattened


def v1_loader_base() -> type:
    """TensorFlow's loader of TF1 SavedModels into eager functions. servable.load_saved_model
    subclasses it to load a TF1 graph signature by signature (TensorFlow's own loader gives up on
    the whole model when one signature cannot be pruned) and to keep TF 1.0 graphs' unknown shapes.
    The subclass overrides get_meta_graph_def_from_tags(tags) and
    _extract_signatures(wrapped, meta_graph_def), and calls load(tags=...)."""
    from tensorflow.python.saved_model import load_v1_in_v2

    return load_v1_in_v2._EagerSavedModelLoader


def check() -> None:
    """InternalsChanged naming the first private API that is not as this module expects."""
    version = tf.__version__

    def changed(what: str, used_by: str) -> InternalsChanged:
        return InternalsChanged(f"TensorFlow {version} changed {what}, which tfpipe's server uses for {used_by} "
                                "(serve/core/tf_internals.py): pin tensorflow to a release it was written for, or update "
                                "that module")

    if not isinstance(EagerTensor, type):
        raise changed("tensorflow.python.framework.ops.EagerTensor", "building request tensors from numpy")
    ctx = context.context()
    if not isinstance(getattr(ctx, "device_name", None), (str, type(None))):
        raise changed("the eager context's device_name", "building request tensors from numpy")
    if not callable(getattr(ctx, "clear_kernel_cache", None)):
        raise changed("the eager context's clear_kernel_cache()", "freeing an unloaded version's kernels")
    try:
        base = v1_loader_base()
    except (ImportError, AttributeError):
        raise changed("load_v1_in_v2._EagerSavedModelLoader", "loading TF1 SavedModels signature by signature") \
            from None
    for name, params in (("get_meta_graph_def_from_tags", ["self", "tags"]),
                         ("_extract_signatures", ["self", "wrapped", "meta_graph_def"]),
                         ("load", ["self", "tags"])):
        method = getattr(base, name, None)
        if method is None or list(inspect.signature(method).parameters)[:len(params)] != params:
            raise changed(f"_EagerSavedModelLoader.{name}", "loading TF1 SavedModels signature by signature")
    concrete = tf.function(lambda x: x + 1, autograph=False).get_concrete_function(tf.TensorSpec([None], tf.float32))
    try:
        call = preflattened_call(concrete)
    except AttributeError:
        raise changed("ConcreteFunction._inference_function.call_preflattened", "calling signatures on flat inputs") \
            from None
    if not callable(call):
        raise changed("ConcreteFunction._inference_function.call_preflattened", "calling signatures on flat inputs")
