"""Serving stage: TF Serving configs and launcher, and an embedded server with TF Serving's flags and APIs."""
