"""Serving stage: TF Serving configs and launcher, embedded TF-Serving-compatible server (issue #6)."""
