"""Export stage: versioned SavedModel, warmup records and measured TFLite variants."""
