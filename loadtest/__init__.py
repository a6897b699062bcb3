"""Load-test stage: locust users, payloads, sweeps and reports (issue #7)."""
