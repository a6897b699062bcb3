"""Load-test stage: locust users, payloads, sweeps, SLO gate and reports."""
