"""TensorFlow Serving's own things, apart from the embedded server: its config files and the
protos they need (read by the embedded server too), the tensorflow_model_server / container
launcher, and Kubernetes manifests for a TF Serving fleet."""
