"""Export stage: versioned SavedModel, warmup records and TFLite variants (issue #5)."""
