"""The transports: TF Serving's REST API (aiohttp) and gRPC API (grpc.aio). They only translate:
bytes to a model spec, a signature name and inputs (through serve/codecs), one call into the
core (serve/core/inference.py), its answer back to bytes, and the request's metrics and log."""
