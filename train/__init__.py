"""Training stage: tf.data input and the Keras 3 trainer (issue #4)."""
