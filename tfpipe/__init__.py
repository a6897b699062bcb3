"""tfpipe: raw data to a served, load-tested TensorFlow model. CLI, config and orchestration."""

from pipeline import __version__

__all__ = ["__version__"]
