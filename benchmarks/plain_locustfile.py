"""The baseline bench_loadtest.py compares against: a plain locust HttpUser, one process."""

from locust import HttpUser, constant, task


class PlainUser(HttpUser):
    wait_time = constant(0)

    @task
    def predict(self):
        self.client.post("/v1/models/noop:predict", data='{"instances": [1.0]}',
                         headers={"Content-Type": "application/json"})
