"""`tfpipe skew`: the features of logged requests against the training split's statistics."""
