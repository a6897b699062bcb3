"""`tfpipe tune`: TF Serving's BatchingParameters searched by load-testing the server restarted with each candidate."""
