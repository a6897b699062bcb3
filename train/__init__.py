"""Training stage: tf.data input and the Keras 3 trainer, with checkpoints and resume."""
