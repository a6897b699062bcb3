"""Kubernetes manifests for a TF Serving fleet: ConfigMap (the text-proto configs), Deployment,
Service and HorizontalPodAutoscaler."""

from __future__ import annotations

import os

import yaml

from tfpipe.serve.flags import ServeOptions
from tfpipe.serve.tfserving.configs import model_server_config
from tfpipe.serve.tfserving.launcher import (
    CONTAINER_CONFIG,
    CONTAINER_MODELS,
    container_base_paths,
    image,
    server_flags,
    write_configs,
)

APP = "tfpipe-serving"
MODEL_CLAIM = "tfpipe-models"


def manifests(opts: ServeOptions, config_dir: str) -> list[dict]:
    config = model_server_config(opts)
    remote = all("://" in c.base_path for c in config.model_config_list.config)
    # Local base paths become a read-only volume (a PersistentVolumeClaim the user fills);
    # gs:// or s3:// base paths are read by TF Serving directly (container_base_paths).
    paths = write_configs(opts, config_dir, container_base_paths(config))
    files = {}
    for path in paths.values():
        with open(path) as f:
            files[os.path.basename(path)] = f.read()
    first = config.model_config_list.config[0].name
    args = server_flags(opts, {k: f"{CONTAINER_CONFIG}/{k}.config" for k in paths}, ports=False)
    args = [a for a in args if not a.startswith("--model_config_file_poll")] + [
        "--model_config_file_poll_wait_seconds=60"]  # a ConfigMap edit reaches pods without a restart
    resources = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
    if opts.gpu:
        resources["limits"]["nvidia.com/gpu"] = 1
    mounts = [{"name": "config", "mountPath": CONTAINER_CONFIG, "readOnly": True}]
    volumes = [{"name": "config", "configMap": {"name": f"{APP}-config"}}]
    if not remote:
        mounts.append({"name": "models", "mountPath": CONTAINER_MODELS, "readOnly": True})
        volumes.append({"name": "models", "persistentVolumeClaim": {"claimName": MODEL_CLAIM, "readOnly": True}})
    labels = {"app": APP}
    container = {
        "name": "tensorflow-serving",
        "image": image(opts),
        "args": args,
        "ports": [{"name": "grpc", "containerPort": 8500}, {"name": "rest", "containerPort": 8501}],
        "readinessProbe": {"httpGet": {"path": f"/v1/models/{first}", "port": "rest"},
                           "initialDelaySeconds": 5, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "grpc"}, "initialDelaySeconds": 30, "periodSeconds": 10},
        "resources": resources,
        "volumeMounts": mounts,
    }
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{APP}-config", "labels": labels},
         "data": files},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": APP, "labels": labels},
         "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels,
                                            "annotations": {"prometheus.io/scrape": "true",
                                                            "prometheus.io/port": "8501",
                                                            "prometheus.io/path": "/monitoring/prometheus/metrics"}},
                               "spec": {"containers": [container], "volumes": volumes,
                                        "terminationGracePeriodSeconds": 30}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": APP, "labels": labels},
         "spec": {"selector": labels, "ports": [{"name": "grpc", "port": 8500, "targetPort": "grpc"},
                                                {"name": "rest", "port": 8501, "targetPort": "rest"}]}},
        {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": APP, "labels": labels},
         "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": APP},
                  "minReplicas": 2, "maxReplicas": 10,
                  "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                                                                "target": {"type": "Utilization",
                                                                           "averageUtilization": 70}}}]}},
    ]


def emit(opts: ServeOptions, out_dir: str, log=print) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    docs = manifests(opts, os.path.join(out_dir, "config"))
    written = []
    for doc in docs:
        path = os.path.join(out_dir, f"{doc['kind'].lower()}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(doc, f, sort_keys=False)
        written.append(path)
    log(f"wrote {', '.join(os.path.basename(p) for p in written)} to {out_dir}; apply with: kubectl apply -f {out_dir}")
    if any(v.get("persistentVolumeClaim") for d in docs if d["kind"] == "Deployment"
           for v in d["spec"]["template"]["spec"]["volumes"]):
        log(f"the Deployment mounts PersistentVolumeClaim '{MODEL_CLAIM}' at {CONTAINER_MODELS}: copy each "
            f"model's base path to {CONTAINER_MODELS}/NAME there, or use gs:// base paths")
    return written
