"""The codecs between the transports' bytes and the core's numpy arrays, kept apart from both:
tensor_proto (TF Serving's protos, for gRPC and the request logs) and rest_json (TF Serving's
REST JSON). Each bounds what a request may make the server build, before it builds it."""
