"""The serving core, below the transports: `inference.Inference` (predict, classify, regress,
metadata and status, each resolving its servable once), the model manager (which versions
are loaded and served), the servables (one loaded SavedModel version and its signatures), the
batcher and its parameters, and every private TensorFlow API the server uses (tf_internals)."""
