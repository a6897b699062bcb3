"""Which model versions are loaded: polling base paths, version policies, labels, hot reload.

Like TF Serving's availability-preserving policy, a new version loads (and runs its
warmup) beside the old one; requests move to it once it is AVAILABLE, and only then is
the old one unloaded. A version that fails to load is reported in status with its error
and never takes traffic; it is retried when its directory changes.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tensorflow_serving.config import model_server_config_pb2

from serve.errors import invalid, not_found
from serve.servable import Servable

START, LOADING, AVAILABLE, UNLOADING, END = "START", "LOADING", "AVAILABLE", "UNLOADING", "END"


@dataclass
class VersionState:
    version: int
    state: str = START
    error_code: str = "OK"
    error_message: str = ""
    servable: Servable | None = None
    mtime: float = 0.0
    load_seconds: float = 0.0
    warmup_records: int = 0


@dataclass
class Model:
    config: model_server_config_pb2.ModelConfig
    versions: dict[int, VersionState] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.config.name

    def available(self) -> dict[int, Servable]:
        return {v: s.servable for v, s in self.versions.items() if s.state == AVAILABLE and s.servable}


def versions_on_disk(base_path: str) -> dict[int, float]:
    """Numeric subdirectories of a base path (the layout TF Serving polls) and their mtimes."""
    try:
        entries = list(os.scandir(base_path))
    except OSError:
        return {}
    return {int(e.name): e.stat().st_mtime for e in entries
            if e.name.isdigit() and e.is_dir()}


def wanted_versions(policy, on_disk: dict[int, float], failed: set[int]) -> list[int]:
    """The versions a model version policy asks for (failed loads are passed over by 'latest')."""
    kind = policy.WhichOneof("policy_choice") if policy is not None else None
    if kind == "all":
        return sorted(on_disk)
    if kind == "specific":
        return sorted(v for v in policy.specific.versions if v in on_disk)
    n = policy.latest.num_versions if kind == "latest" and policy.latest.num_versions > 0 else 1
    return sorted((v for v in on_disk if v not in failed), reverse=True)[:n]


class ModelManager:
    """Loads, swaps and unloads servables; `resolve` is what request handlers call."""

    def __init__(self, config: model_server_config_pb2.ModelServerConfig, warmup: bool = True,
                 log: Callable[[str], None] = print, on_load: Callable[[Model, VersionState], None] | None = None):
        self.warmup = warmup
        self.log = log
        self.on_load = on_load
        self._lock = threading.RLock()
        self._poll_lock = threading.Lock()  # one poll at a time: the poller and config reloads
        self._models: dict[str, Model] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.set_config(config)

    # -- configuration --------------------------------------------------------------
    def set_config(self, config: model_server_config_pb2.ModelServerConfig) -> None:
        """Replace the served models (HandleReloadConfigRequest); checks before changing anything."""
        if config.WhichOneof("config") == "custom_model_config":
            raise invalid("custom_model_config is not supported; use model_config_list")
        names = [c.name for c in config.model_config_list.config]
        if len(set(names)) != len(names):
            raise invalid(f"Illegal to list model {sorted({n for n in names if names.count(n) > 1})[0]} "
                          "multiple times in config list")
        for c in config.model_config_list.config:
            if not c.name or not c.base_path:
                raise invalid("every model config needs a name and a base_path")
            if c.model_platform not in ("", "tensorflow"):
                raise invalid(f"model {c.name}: model_platform {c.model_platform!r} is not supported (tensorflow)")
        with self._lock:
            old = self._models
            self._models = {}
            for c in config.model_config_list.config:
                model = old.get(c.name)
                if model is not None and model.config.base_path == c.base_path:
                    model.config = c
                else:
                    model = Model(c)
                self._models[c.name] = model
            removed = [m for n, m in old.items() if n not in self._models or self._models[n] is not m]
        for m in removed:
            for s in m.versions.values():
                s.state, s.servable = END, None
        if self._thread is not None:
            self.poll()

    def models(self) -> list[Model]:
        with self._lock:
            return list(self._models.values())

    # -- polling --------------------------------------------------------------------
    def start(self, poll_seconds: float) -> None:
        """Load what is on disk now, then poll every `poll_seconds` (0: once, <0: never again)."""
        self.poll()
        self._thread = threading.Thread(target=self._loop, args=(poll_seconds,), name="tfpipe-model-poller",
                                        daemon=True)
        if poll_seconds > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            try:
                self.poll()
            except Exception as e:  # the poller must outlive one bad poll
                self.log(f"model poll failed: {e}")

    def poll(self) -> None:
        with self._poll_lock:
            for model in self.models():
                self._poll_model(model)

    def _poll_model(self, model: Model) -> None:
        on_disk = versions_on_disk(model.config.base_path)
        failed = {v for v, s in model.versions.items()
                  if s.error_code != "OK" and on_disk.get(v) == s.mtime}
        wanted = wanted_versions(model.config.model_version_policy if model.config.HasField("model_version_policy")
                                 else None, on_disk, failed)
        for v in wanted:
            s = model.versions.get(v)
            if s is None or (s.state == END and (s.error_code == "OK" or on_disk[v] != s.mtime)):
                self._load(model, v, on_disk[v])
        # Unload only what is no longer wanted, and only once something wanted is serving.
        wanted_up = any(model.versions.get(v) and model.versions[v].state == AVAILABLE for v in wanted)
        for v, s in list(model.versions.items()):
            if s.state == AVAILABLE and v not in wanted and (wanted_up or v not in on_disk):
                with self._lock:
                    s.state = UNLOADING
                    s.servable = None  # in-flight requests keep their own reference
                    s.state = END
                self.log(f"unloaded {model.name} version {v}")

    def _load(self, model: Model, version: int, mtime: float) -> None:
        s = VersionState(version, LOADING, mtime=mtime)
        with self._lock:
            model.versions[version] = s
        t0 = time.perf_counter()
        path = os.path.join(model.config.base_path, str(version))
        try:
            servable = Servable(model.name, version, path)
            s.warmup_records = servable.warmup() if self.warmup else 0
        except Exception as e:
            msg = getattr(e, "message", None) or str(e) or type(e).__name__
            with self._lock:
                s.state, s.error_code, s.error_message = END, "UNKNOWN", f"Failed to load {path}: {msg.splitlines()[0]}"
            self.log(f"version {version} of {model.name} failed to load: {s.error_message}")
            return
        s.load_seconds = time.perf_counter() - t0
        with self._lock:
            s.servable, s.state = servable, AVAILABLE
        self.log(f"loaded {model.name} version {version} in {s.load_seconds:.2f}s"
                 + (f" ({s.warmup_records} warmup requests)" if s.warmup_records else ""))
        if self.on_load:
            self.on_load(model, s)

    # -- lookups --------------------------------------------------------------------
    def _model(self, name: str) -> Model:
        with self._lock:
            model = self._models.get(name)
        if model is None:
            raise not_found(f"Servable not found for request: Latest({name})")
        return model

    def resolve(self, name: str, version: int | None = None, label: str | None = None) -> Servable:
        """The servable a request names: a version, a label, or (neither) the latest available."""
        model = self._model(name)
        with self._lock:
            available = model.available()
            if label:
                labels = dict(model.config.version_labels)
                if label not in labels:
                    raise invalid(f"Unrecognized servable version label: {label}")
                version = labels[label]
            if version is None:
                if not available:
                    raise not_found(f"Servable not found for request: Latest({name})")
                return available[max(available)]
            if version not in available:
                raise not_found(f"Servable not found for request: Specific({name}, {version})")
            return available[version]

    def status(self, name: str, version: int | None = None, label: str | None = None) -> list[VersionState]:
        model = self._model(name)
        with self._lock:
            if label:
                labels = dict(model.config.version_labels)
                if label not in labels:
                    raise invalid(f"Unrecognized servable version label: {label}")
                version = labels[label]
            states = sorted(model.versions.values(), key=lambda s: -s.version)
            if version is not None:
                states = [s for s in states if s.version == version]
                if not states:
                    raise not_found(f"Could not find version {version} of model {name}")
            elif not states:
                raise not_found(f"Could not find any versions of model {name}")
            return [VersionState(s.version, s.state, s.error_code, s.error_message) for s in states]

    def loaded(self) -> dict[str, list[int]]:
        with self._lock:
            return {m.name: sorted(m.available()) for m in self._models.values()}
