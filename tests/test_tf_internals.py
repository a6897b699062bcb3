"""The private TensorFlow APIs the server relies on (serve/core/tf_internals.py), on the installed
TensorFlow: present in the shape the server expects, and doing what it uses them for. A
TensorFlow upgrade that changes one fails here, by name, before a request meets it."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfpipe.serve.core import tf_internals


def test_every_private_api_is_as_the_server_expects():
    tf_internals.check()  # raises InternalsChanged naming the API otherwise


def test_a_raw_eager_tensor_equals_tf_constant():
    value = np.arange(6, dtype=np.float32).reshape(3, 2)
    raw = tf_internals.EagerTensor(value, tf_internals.device_name(), tf.float32.as_datatype_enum)
    assert raw.dtype == tf.float32 and raw.shape == (3, 2)
    np.testing.assert_array_equal(raw.numpy(), tf.constant(value).numpy())


def test_a_preflattened_call_takes_the_flat_inputs_and_the_captures():
    offset = tf.Variable(10.0)
    concrete = tf.function(lambda x: x * 2 + offset, autograph=False).get_concrete_function(
        tf.TensorSpec([None], tf.float32))
    call = tf_internals.preflattened_call(concrete)
    out = call([tf.constant([1.0, 2.0])] + list(concrete.captured_inputs))
    np.testing.assert_allclose(tf.nest.flatten(out)[0].numpy(), [12.0, 14.0])


def test_the_v1_loader_loads_a_tf1_graph_signature_by_signature(tmp_path):
    from serving_models import save_one_broken_signature

    from tfpipe.serve.core.servable import Servable

    save_one_broken_signature(str(tmp_path / "1"))
    servable = Servable("broken", 1, str(tmp_path / "1"))
    # the signature that cannot be pruned from the graph is reported; the others load
    assert servable.broken and servable.signatures
    assert set(servable.broken).isdisjoint(servable.signatures)


def test_clearing_the_kernel_cache_keeps_functions_callable():
    f = tf.function(lambda x: x + 1)
    assert float(f(tf.constant(1.0))) == 2.0
    tf_internals.clear_kernel_cache()
    assert float(f(tf.constant(2.0))) == 3.0


def test_a_changed_api_is_named_with_what_uses_it(monkeypatch):
    """What a TensorFlow release that renamed the loader's hook would meet."""
    import pytest

    monkeypatch.delattr(tf_internals.v1_loader_base(), "_extract_signatures")
    with pytest.raises(tf_internals.InternalsChanged, match=r"_EagerSavedModelLoader\._extract_signatures.*TF1"):
        tf_internals.check()
