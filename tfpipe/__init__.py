"""tfpipe: raw data to a served, load-tested TensorFlow model.

The stages are subpackages (tfpipe.pipeline, tfpipe.train, tfpipe.export, tfpipe.serve,
tfpipe.loadtest); tfpipe.cli and tfpipe.run drive them. Importing this package imports no
stage and no TensorFlow."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tfpipe")
except PackageNotFoundError:  # a source tree that is not installed
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
