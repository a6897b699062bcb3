"""TF Serving's API protos in a process that never runs TensorFlow: the load generator.

`tensorflow_serving.apis` imports TensorFlow's own messages as `tensorflow.core.*_pb2`, and
importing any `tensorflow.` module first runs `tensorflow/__init__.py`, which loads the whole
runtime: seconds of CPU in every generator process, for messages that need only protobuf.
`without_tensorflow_runtime()` registers, as `tensorflow`, a package that holds nothing but the
installed package's directory, so those message modules load as the plain protobuf modules they
are. Whatever else the process then asks of `tensorflow` fails with an error that says why."""

from __future__ import annotations

import importlib.util
import sys
import types


class _MessagesOnly(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        # AttributeError, as hasattr() and the import system expect of a module
        raise AttributeError(f"tensorflow.{name}: this process loaded only TensorFlow's protobuf messages "
                             "(tfpipe.loadtest.serving_protos), not its runtime")


def without_tensorflow_runtime() -> bool:
    """Make `tensorflow.core.*_pb2` (and so `tensorflow_serving.apis`) importable without running
    TensorFlow; call it before anything imports them. True if it did; False where TensorFlow is
    already imported (its messages come with it) or not installed (the import fails as usual)."""
    if "tensorflow" in sys.modules:
        return False
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        return False
    package = _MessagesOnly("tensorflow", "TensorFlow's protobuf messages, without its runtime")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__file__ = spec.origin
    sys.modules["tensorflow"] = package
    return True
