"""Which model versions are loaded: polling base paths, version policies, labels, hot reload.

Follows TF Serving's ServerCore with the AvailabilityPreservingPolicy:
  * base paths are polled every --file_system_poll_wait_seconds; a child directory whose
    name parses as an integer is a version (`00000123` is version 123);
  * a new version loads (and runs its warmup) beside the old one; requests move to it once
    it is AVAILABLE, and only then is the old one unloaded;
  * a failed load is retried --max_num_load_retries times, --load_retry_interval_micros
    apart, while the version is still wanted, its status LOADING with the last attempt's
    error meanwhile; then it is reported in status (END) with its error and never takes
    traffic (a later change of its directory tries again);
  * at start, and for models a config reload adds, the caller waits until each model has a
    version AVAILABLE; a model whose versions all failed is an error; a base path that does
    not exist, or holds no version, is reported and polled until one appears;
  * version labels may point only at AVAILABLE versions, unless
    --allow_version_labels_for_unavailable_models (then only new labels may);
  * with shadow traffic or a canary on (`ManagerOptions.candidates`, --shadow, --canary), each
    model whose base path has a `candidates/` folder also loads its newest candidate
    (BASE/NAME/candidates/N, when N is newer than every version in the served range and no canary
    rolled it back: `reject`, and the history's CANARY_ROLLED_BACK events) with the same loading
    and warmup, re-checked at each poll: a newer candidate replaces it, one that left the folder
    (promoted, removed) or was rolled back is unloaded. A candidate is never resolved by a request
    nor shown in status; a failed load is logged once and not retried until its directory changes.
Loads run on --num_load_threads threads (0: one after another), unloads on
--num_unload_threads (0: in the thread that decides them). After an unload the freed
model's memory is handed back to the operating system (cyclic garbage collected, then
glibc's malloc_trim), so that hot reloads keep the process flat.
"""

from __future__ import annotations

import ctypes
import gc
import os
import re
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

from tensorflow_serving.config import model_server_config_pb2

from tfpipe.serve.core.servable import Servable
from tfpipe.versions import CANDIDATES, HISTORY, canary_rolled_back
from tfpipe.serve.errors import ServingError, invalid, not_found, precondition, quoted, unknown
from tfpipe.serve.metrics import rss_bytes

START, LOADING, AVAILABLE, UNLOADING, END = "START", "LOADING", "AVAILABLE", "UNLOADING", "END"
FAILED = "UNKNOWN"  # the error code a failed load reports in status
_INT64 = re.compile(r"^\s*[+-]?\d+\s*$")


class ModelSpec(NamedTuple):
    """The model a request names, as the codecs read it from TF Serving's ModelSpec (a message, or
    a REST path): a version, a label, or neither (the latest available)."""

    name: str
    version: int | None = None
    label: str | None = None

    @property
    def unversioned(self) -> bool:
        """Neither a version nor a label: what the canary and the shadow may take."""
        return self.version is None and not self.label


@dataclass
class ManagerOptions:
    load_threads: int = 0
    unload_threads: int = 0
    max_load_retries: int = 5
    retry_interval_seconds: float = 60.0
    allow_unavailable_labels: bool = False
    candidates: bool = False  # also load each model's newest candidate (shadow traffic, canary)


@dataclass
class VersionState:
    version: int
    state: str = START
    error_code: str = "OK"
    error_message: str = ""
    servable: Servable | None = None
    mtime: float = 0.0
    load_seconds: float = 0.0
    load_rss_bytes: int = 0  # how much the process grew while it loaded (its footprint)
    warmup_records: int = 0
    cancel: threading.Event = field(default_factory=threading.Event)  # set: stop retrying this load


@dataclass
class Model:
    config: model_server_config_pb2.ModelConfig
    versions: dict[int, VersionState] = field(default_factory=dict)
    finding: str = ""  # what the last poll found wrong at the base path (logged when it changes)
    candidate: bool = False  # the entry of a model's candidates (base path BASE/NAME/candidates), for shadow traffic
    newest_on_disk: int | None = None  # the highest version the last poll found (served models)

    @property
    def name(self) -> str:
        return self.config.name

    def what(self, version: int) -> str:
        """How the log names one of its versions."""
        return f"candidate {version}" if self.candidate else f"version {version}"

    @property
    def policy(self):
        """The model's version policy; None: TF Serving's default (the latest version)."""
        return self.config.model_version_policy if self.config.HasField("model_version_policy") else None

    def available(self) -> dict[int, Servable]:
        return {v: s.servable for v, s in self.versions.items() if s.state == AVAILABLE and s.servable}


def version_number(name: str) -> int | None:
    """A directory name as TF Serving reads it (absl::SimpleAtoi into int64): `00000123` is
    123; anything that is not a whole number in range is not a version."""
    if not _INT64.match(name):
        return None
    value = int(name)
    return value if -2**63 <= value < 2**63 else None


def versions_on_disk(base_path: str) -> dict[int, tuple[str, float]]:
    """Version subdirectories of a base path: version -> (directory name, mtime). Two names
    for one number (`1` and `001`): the last in name order wins, as TF Serving warns."""
    try:
        entries = sorted(os.scandir(base_path), key=lambda e: e.name)
    except OSError:
        return {}
    out = {}
    for e in entries:
        v = version_number(e.name)
        if v is not None and e.is_dir():
            out[v] = (e.name, e.stat().st_mtime)
    return out


def base_path_finding(name: str, base_path: str, on_disk: dict, policy) -> str:
    """'' when the base path is fine; otherwise what is wrong with it, in words a user can act on."""
    if not os.path.exists(base_path):
        return (f"Could not find base path {base_path} for servable {name}: it does not exist "
                f"(it should hold numbered version directories, e.g. {base_path}/1/saved_model.pb)")
    if not os.path.isdir(base_path):
        return f"Could not find base path {base_path} for servable {name}: it is a file, not a directory"
    if on_disk:
        if policy is not None and policy.WhichOneof("policy_choice") == "specific":
            missing = sorted(set(policy.specific.versions) - set(on_disk))
            if missing:
                return (f"Version(s) {missing} of servable {name}, which were requested to be served as 'specific' "
                        f"versions in the servable's version policy, were not found in {base_path} "
                        f"(it has {sorted(on_disk)})")
        return ""
    try:
        entries = sorted(e.name + ("/" if e.is_dir() else "") for e in os.scandir(base_path))
    except OSError as e:
        return f"Could not read base path {base_path} for servable {name}: {e.strerror}"
    held = ", ".join(entries[:8]) + (f", ... ({len(entries)} entries)" if len(entries) > 8 else "") or "nothing"
    hint = (f"; a SavedModel sits directly in the base path: move it into {base_path}/1/"
            if "saved_model.pb" in entries else "")
    return (f"No versions of servable {name} found under base path {base_path}. Did you forget to name your leaf "
            f"directory as a number (eg. '/1/')? It holds: {held}{hint}")


def wanted_versions(policy, on_disk: dict, failed: set[int]) -> list[int]:
    """The versions a model version policy asks for (failed loads are passed over by 'latest')."""
    kind = policy.WhichOneof("policy_choice") if policy is not None else None
    if kind == "all":
        return sorted(on_disk)
    if kind == "specific":
        return sorted(v for v in policy.specific.versions if v in on_disk)
    n = policy.latest.num_versions if kind == "latest" and policy.latest.num_versions > 0 else 1
    return sorted((v for v in on_disk if v not in failed), reverse=True)[:n]


def release_memory(alive: Callable[[], bool] | None = None, wait: float = 30.0) -> None:
    """Hand an unloaded model's memory back to the OS:
      * wait until the requests still holding any part of it let go (`alive()` is false; a
        model is all reference cycles, so only a collection frees it) — a model freed later by
        an automatic collection would stay in the heap;
      * clear TensorFlow's eager kernel cache, which keeps every thread's instantiated copy of
        each function it ran, removed functions included (the serving version's kernels are
        instantiated again on their next call);
      * let glibc return the freed heap (malloc_trim).
    Without the last two, RSS grew with every hot reload (tests/test_serve.py checks it stays
    flat over twelve)."""
    deadline = time.monotonic() + wait
    gc.collect()
    while alive is not None and alive() and time.monotonic() < deadline:
        time.sleep(0.05)
        gc.collect()
    if alive is None or not alive():
        from tfpipe.serve.core.tf_internals import clear_kernel_cache

        clear_kernel_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class ModelManager:
    """Loads, swaps and unloads servables; `resolve` is what request handlers call."""

    def __init__(self, config: model_server_config_pb2.ModelServerConfig,
                 make_servable: Callable[[str, int, str], Servable],
                 options: ManagerOptions = ManagerOptions(), log: Callable[[str], None] = print,
                 on_unload: Callable[[Servable], None] | None = None,
                 on_config: Callable[[model_server_config_pb2.ModelServerConfig], None] | None = None,
                 warm: Callable[[Servable], int] | None = None):
        """`on_config(config)` runs before a config is installed, at start and on every
        reload; a ServingError from it refuses the config (the request loggers' check).
        `warm(servable)` replays a version's warmup records as it loads (with warmup on; the
        server gives the codecs' `warmup.replay`), returning how many; None: none are replayed."""
        self.make_servable = make_servable
        self.warm = warm
        self.options = options
        self.log = log
        self.on_unload = on_unload
        self.on_config = on_config
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # notified on every state change
        self._poll_lock = threading.Lock()  # one poll at a time: the poller and config reloads
        self._models: dict[str, Model] = {}
        self._shadows: dict[str, Model] = {}  # served model's name -> its candidates' entry (options.candidates)
        self._rejected: dict[str, set[int]] = {}  # model -> candidates a canary rolled back (and the history says)
        self._history_seen: dict[str, tuple] = {}  # base path -> (its history file's stat, what _rolled_back read)
        self.on_poll: list[Callable[[], None]] = []  # called after every poll (shadow reports, canary decisions)
        self._labels: dict[str, dict[str, int]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._polled = False
        self._loaders = ThreadPoolExecutor(max(1, options.load_threads), thread_name_prefix="tfpipe-load")
        self._unloaders = (ThreadPoolExecutor(options.unload_threads, thread_name_prefix="tfpipe-unload")
                           if options.unload_threads > 0 else None)
        if on_config is not None:
            on_config(config)
        self._install(config)

    # -- configuration --------------------------------------------------------------
    def _install(self, config: model_server_config_pb2.ModelServerConfig) -> tuple[list[str], list[Model]]:
        """Replace the served models; returns (new model names, removed models)."""
        if config.WhichOneof("config") == "custom_model_config":
            raise invalid("ModelServer does not yet support custom model config.")
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
            self._models, new = {}, []
            for c in config.model_config_list.config:
                model = old.get(c.name)
                if model is not None and model.config.base_path == c.base_path:
                    model.config = c
                else:
                    model = Model(c)
                    new.append(c.name)
                self._models[c.name] = model
            removed = [m for n, m in old.items() if n not in self._models or self._models[n] is not m]
        return new, removed

    def set_config(self, config: model_server_config_pb2.ModelServerConfig) -> None:
        """HandleReloadConfigRequest / a changed --model_config_file: swap the models, wait
        for the new ones, then apply the version labels (checked against what is AVAILABLE)."""
        if self.on_config is not None:
            self.on_config(config)
        with self._lock:  # the poller sees the new models and their labels together, or neither
            new, removed = self._install(config)
            try:  # labels whose versions are AVAILABLE now move before a version they left is retired
                self._set_labels(config)
                moved = True
            except ServingError:  # one names a version still to load: after the loads, as before
                moved = False
        for m in removed:
            for s in list(m.versions.values()):
                self._retire(m, s)
        if self._polled:
            self.poll()
            self.wait_for(new)
        if not moved:
            self._set_labels(config)
        for model in self.models():  # a version the labels held, now free to go (see _settle)
            self._settle(model)

    def models(self) -> list[Model]:
        with self._lock:
            return list(self._models.values())

    def _set_labels(self, config: model_server_config_pb2.ModelServerConfig) -> None:
        labels: dict[str, dict[str, int]] = {}
        with self._lock:
            for c in config.model_config_list.config:
                model = self._models.get(c.name)
                for label, version in c.version_labels.items():
                    old = self._labels.get(c.name, {}).get(label)
                    may_wait = self.options.allow_unavailable_labels and old in (None, version)
                    if not may_wait and (model is None or version not in model.available()):
                        raise precondition(f"Request to assign label to version {version} of model {c.name}, "
                                           "which is not currently available for inference")
                    labels.setdefault(c.name, {})[label] = version
            self._labels = labels

    # -- polling --------------------------------------------------------------------
    def start(self, poll_seconds: float, config: model_server_config_pb2.ModelServerConfig | None = None) -> None:
        """Poll now, then every `poll_seconds` (0: only now; < 0: never, as TF Serving's testing
        mode); wait until every model has a version AVAILABLE; then apply the labels."""
        if poll_seconds < 0:
            self.log("--file_system_poll_wait_seconds < 0: base paths are never polled, so no model can load")
        else:
            self.poll()
        self._polled = True
        if poll_seconds > 0:
            self._thread = threading.Thread(target=self._loop, args=(poll_seconds,), name="tfpipe-model-poller",
                                            daemon=True)
            self._thread.start()
        self.wait_for([m.name for m in self.models()], reminder=not poll_seconds > 0)
        if config is not None:
            try:
                self._set_labels(config)
            except ServingError as e:
                raise unknown(e.message) from None

    def wait_for(self, names: list[str], reminder: bool = False) -> None:
        """Block until each named model has an AVAILABLE version; UNKNOWN naming the models
        whose wanted versions all failed. Returns early (quietly) once the manager stops."""
        t0, said = time.monotonic(), 0.0
        with self._lock:
            while not self._stop.is_set():
                pending, failed = [], []
                for name in names:
                    model = self._models.get(name)
                    if model is None or model.available():
                        continue
                    states = list(model.versions.values())
                    if states and all(s.state == END and s.error_code == FAILED for s in states):
                        failed.append(model)
                    else:
                        pending.append(model)
                if failed and not pending:
                    details = ", ".join(f"{{{{name: {m.name} version: {max(m.versions)}}} due to error: "
                                        f"{m.versions[max(m.versions)].error_message}}}" for m in failed)
                    raise unknown(f"{len(failed)} model(s) did not become available: {{{details}}}")
                if not pending:
                    return
                waited = time.monotonic() - t0
                if waited - said >= 30:
                    said = waited
                    self.log(f"still waiting for a version of {', '.join(m.name for m in pending)} to load "
                             f"({waited:.0f}s)" + (": nothing more will be polled" if reminder else ""))
                self._changed.wait(timeout=5.0)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._changed.notify_all()
            for m in [*self._models.values(), *self._shadows.values()]:
                for s in m.versions.values():
                    s.cancel.set()
        self._loaders.shutdown(wait=False, cancel_futures=True)
        if self._unloaders:
            self._unloaders.shutdown(wait=False, cancel_futures=True)

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
            if self.options.candidates:
                for model in self._sync_shadows():
                    self._poll_model(model)
        for call in self.on_poll:
            call()

    def _sync_shadows(self) -> list[Model]:
        """The candidates' entries, one per served model whose base path has a candidates/ folder now;
        the entries of the others (folder gone, model gone) are dropped and their candidate unloaded."""
        with self._lock:
            served, old = dict(self._models), self._shadows
        keep = {}
        for name, model in served.items():
            folder = os.path.join(model.config.base_path, CANDIDATES)
            if not os.path.isdir(folder):
                continue
            rejected = self._rolled_back(model.config.base_path)
            with self._lock:
                self._rejected[name] = rejected | self._rejected.get(name, set())
            entry = old.get(name)
            if entry is None or entry.config.base_path != folder:
                entry = Model(model_server_config_pb2.ModelConfig(name=name, base_path=folder), candidate=True)
            keep[name] = entry
        with self._lock:
            self._shadows = keep
        for gone in [m for n, m in old.items() if keep.get(n) is not m]:
            for s in list(gone.versions.values()):
                self._retire(gone, s)
        return list(keep.values())

    def _rolled_back(self, base_path: str) -> set[int]:
        """The candidates a canary rolled back (versions.canary_rolled_back), the history read again
        only when its file changed (every poll asks)."""
        try:
            st = os.stat(os.path.join(base_path, HISTORY))
            seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            seen = None
        cached = self._history_seen.get(base_path)
        if cached is None or cached[0] != seen:
            cached = self._history_seen[base_path] = (seen, canary_rolled_back(base_path))
        return cached[1]

    def _current(self, model: Model) -> bool:
        """Whether `model` is still an entry of the config (or, a candidates' one, of the shadows)."""
        return (self._shadows if model.candidate else self._models).get(model.name) is model

    def _poll_model(self, model: Model) -> None:
        on_disk = versions_on_disk(model.config.base_path)
        if not model.candidate:
            model.newest_on_disk = max(on_disk) if on_disk else None
            finding = base_path_finding(model.name, model.config.base_path, on_disk, model.policy)
            if finding != model.finding:
                model.finding = finding
                if finding:
                    self.log(finding)
        with self._lock:
            wanted = self._wanted(model, on_disk)
            for v, s in model.versions.items():
                if s.state == LOADING and v not in wanted:
                    s.cancel.set()  # a retrying load of a version no longer wanted stops
            to_load = []
            for v in sorted(wanted, reverse=True):  # the newest first, as TF Serving's policy loads
                s = model.versions.get(v)
                if s is None or (s.state == END and (s.error_code != FAILED or on_disk[v][1] != s.mtime)):
                    s = model.versions[v] = VersionState(v, LOADING, mtime=on_disk[v][1])
                    to_load.append((s, os.path.join(model.config.base_path, on_disk[v][0])))
        for s, path in to_load:
            self._loaders.submit(self._load, model, s, path)
        self._settle(model, set(wanted))

    def _wanted(self, model: Model, on_disk: dict) -> list[int]:
        """Versions the model's policy asks for; a failed load is passed over until its
        directory changes."""
        failed = {v for v, s in model.versions.items()
                  if s.state == END and s.error_code == FAILED and on_disk.get(v, (None, None))[1] == s.mtime}
        if model.candidate:  # the newest candidate, if newer than the served range (not an older one instead)
            served = self._models.get(model.name)
            newest = max(on_disk, default=None)
            above = served is None or served.newest_on_disk is None or (newest or 0) > served.newest_on_disk
            ok = newest is not None and newest not in failed and newest not in self._rejected.get(model.name, ())
            return [newest] if ok and above else []
        return wanted_versions(model.policy, on_disk, failed)

    def _settle(self, model: Model, wanted: set[int] | None = None) -> None:
        """Unload versions no longer wanted, keeping one serving until a wanted one is, and any a
        label still names: a config that moves a label to a version this server has yet to load
        leaves the label on the old one until the move is taken (it is refused until then, and sent
        again), and the old version answers the label's requests until that moment."""
        # the base path is scanned before the lock is taken: every request's `resolve` takes it
        on_disk = versions_on_disk(model.config.base_path) if wanted is None else None
        with self._lock:
            if wanted is None:
                wanted = set(self._wanted(model, on_disk))
            if not self._current(model):
                return
            labelled = set(self._labels.get(model.name, {}).values()) if not model.candidate else set()
            stale = sorted((s for v, s in model.versions.items()
                            if s.state == AVAILABLE and v not in wanted and v not in labelled),
                           key=lambda s: s.version)
            wanted_up = any(model.versions.get(v) and model.versions[v].state == AVAILABLE for v in wanted)
            if wanted and not wanted_up:  # keep the newest stale one serving until a wanted one is
                stale = stale[:-1]
        for s in stale:
            self._retire(model, s)

    def _retire(self, model: Model, s: VersionState) -> None:
        """Stop serving a version; its memory goes once in-flight requests let go of it."""
        with self._lock:
            s.cancel.set()
            held = [s.servable] if s.servable is not None else []  # no local name may keep it alive
            s.servable = None
            if s.state in (AVAILABLE, LOADING, START):
                s.state = UNLOADING if held else END
            self._changed.notify_all()
        if not held:
            return
        if self._unloaders:
            self._unloaders.submit(self._unload, model, s, held)
        else:
            self._unload(model, s, held)

    def _unload(self, model: Model, s: VersionState, held: list[Servable]) -> None:
        servable = held.pop()
        if self.on_unload:
            self.on_unload(servable)
        # In-flight requests may hold the servable, or only a signature's function (a request
        # that resolved its signature before the swap): the version is gone once all are.
        parts = [weakref.ref(servable), *map(weakref.ref, servable.functions())]
        del servable

        def alive() -> bool:
            return any(r() is not None for r in parts)

        t0 = time.monotonic()
        release_memory(alive)
        with self._lock:
            s.state = END
            self._changed.notify_all()
        self.log(f"unloaded {model.name} {model.what(s.version)} ({time.monotonic() - t0:.2f}s, freed: {not alive()})")

    def _load(self, model: Model, s: VersionState, path: str) -> None:
        attempts = 1 + (0 if model.candidate else max(0, self.options.max_load_retries))
        t0, rss0 = time.perf_counter(), rss_bytes()
        servable, error = None, ""
        for attempt in range(1, attempts + 1):
            if s.cancel.is_set() or self._stop.is_set():
                break
            try:
                servable = self.make_servable(model.name, s.version, path)
                s.warmup_records = self.warm(servable) if self.warm and servable.settings.warmup else 0
                break
            except Exception as e:  # noqa: BLE001 (any load failure is reported in status)
                msg = (getattr(e, "message", None) or str(e) or type(e).__name__).strip().splitlines()[0]
                error, servable = f"Failed to load {path}: {msg}", None
                with self._lock:  # status shows the error while the load is retried, not only after
                    if s.state == LOADING:
                        s.error_code, s.error_message = FAILED, error
                        self._changed.notify_all()
                if attempt < attempts:
                    wait = max(0.0, self.options.retry_interval_seconds)
                    self.log(f"loading {model.name} version {s.version} failed (attempt {attempt} of {attempts}); "
                             f"retrying in {wait:g}s: {msg}")
                    if s.cancel.wait(wait):
                        break
        if servable is None:
            with self._lock:
                if s.state == LOADING:
                    s.state, s.error_code = END, FAILED if error else "CANCELLED"
                    s.error_message = error or "the load was cancelled"
                self._changed.notify_all()
            if s.error_code == FAILED:
                self.log(f"{model.what(s.version)} of {model.name} failed to load: {s.error_message}"
                         + ("; not shadowed, nor loaded again until its directory changes" if model.candidate else ""))
            self._settle(model)
            return
        s.load_seconds, s.load_rss_bytes = time.perf_counter() - t0, max(0, rss_bytes() - rss0)
        with self._lock:
            live = s.state == LOADING and self._current(model) and not self._stop.is_set()
            if live:
                s.servable, s.state, s.error_code, s.error_message = servable, AVAILABLE, "OK", ""
            self._changed.notify_all()
        if not live:  # unwanted while it loaded
            with self._lock:
                s.state = END
            if self.on_unload:
                self.on_unload(servable)
            return
        self.log(f"loaded {model.name} {model.what(s.version)}{' for shadow traffic' if model.candidate else ''} "
                 f"in {s.load_seconds:.2f}s, +{s.load_rss_bytes / 2**20:.1f} MiB"
                 + (f" ({s.warmup_records} warmup requests)" if s.warmup_records else ""))
        for key, why in servable.broken.items():
            self.log(f"  signature {key!r} of {model.name} {model.what(s.version)} could not be loaded and answers an "
                     f"error when called: {why}")
        self._settle(model)

    # -- lookups --------------------------------------------------------------------
    def _label_version(self, name: str, label: str) -> int:
        version = self._labels.get(name, {}).get(label)
        if version is None:
            raise invalid(f"Unrecognized servable version label: {quoted(label)}")
        return version

    def resolve(self, name: str, version: int | None = None, label: str | None = None) -> Servable:
        """The servable a request names: a version, a label, or (neither) the latest available."""
        with self._lock:
            model = self._models.get(name)
            if label:
                version = self._label_version(name, label)
            if model is None:
                raise not_found(f"Servable not found for request: {'Latest' if version is None else 'Specific'}"
                                f"({quoted(name)}{'' if version is None else f', {version}'})")
            available = model.available()
            if version is None:
                if not available:
                    raise not_found(f"Servable not found for request: Latest({quoted(name)})")
                return available[max(available)]
            if version not in available:
                raise not_found(f"Servable not found for request: Specific({quoted(name)}, {version})")
            return available[version]

    def status(self, name: str, version: int | None = None, label: str | None = None) -> list[VersionState]:
        with self._lock:
            if label:
                version = self._label_version(name, label)
            model = self._models.get(name)
            states = sorted(model.versions.values(), key=lambda s: -s.version) if model else []
            if version is not None:
                states = [s for s in states if s.version == version]
                if not states:
                    raise not_found(f"Could not find version {version} of model {quoted(name)}")
            elif not states:
                raise not_found(f"Could not find any versions of model {quoted(name)}")
            return [VersionState(s.version, s.state, s.error_code, s.error_message) for s in states]

    def candidate(self, name: str) -> Servable | None:
        """The candidate of model `name` loaded for shadow traffic (AVAILABLE), or None."""
        with self._lock:
            entry = self._shadows.get(name)
            available = entry.available() if entry is not None else {}
            if not available or max(available) in self._rejected.get(name, ()):
                return None
            return available[max(available)]

    def candidates_on(self, on: bool) -> None:
        """Load each model's newest candidate from the next poll on (True), or stop and unload them
        all now (False): shadow traffic switched at run time (`EmbeddedServer.shadowing`)."""
        self.options.candidates = on
        if not on:
            with self._poll_lock, self._lock:
                old, self._shadows = self._shadows, {}
            for entry in old.values():
                for s in list(entry.versions.values()):
                    self._retire(entry, s)

    def wait_candidate(self, name: str, version: int, timeout: float) -> bool:
        """Wait until candidate `version` of model `name` is AVAILABLE (or its load ended otherwise);
        whether it is."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                entry = self._shadows.get(name)
                s = entry.versions.get(version) if entry is not None else None
                if s is not None and s.state in (AVAILABLE, END):
                    return s.state == AVAILABLE
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 1.0))

    def reject(self, name: str, version: int) -> None:
        """A canary rolled back candidate `version` of model `name`: this process no longer routes
        to it (`candidate` answers None at once) and its next poll unloads it."""
        with self._lock:
            self._rejected.setdefault(name, set()).add(version)

    def base_path(self, name: str) -> str | None:
        """The base path of served model `name` (BASE/NAME), or None."""
        with self._lock:
            model = self._models.get(name)
            return model.config.base_path if model is not None else None

    def shadowed(self) -> dict[str, int | None]:
        """Each model whose base path has a candidates/ folder -> its candidate loaded now (None: none)."""
        with self._lock:
            return {name: max(m.available(), default=None) for name, m in self._shadows.items()}

    def serves(self, name: str) -> bool:
        """Whether `name` is one of the models of the current config."""
        return name in self._models

    def load_sizes(self) -> dict[tuple[str, int], int]:
        """(model, version) -> RSS growth of its load, for the versions AVAILABLE now."""
        with self._lock:
            return {(m.name, v): s.load_rss_bytes for m in self._models.values() for v, s in m.versions.items()
                    if s.state == AVAILABLE}

    def loaded(self) -> dict[str, list[int]]:
        with self._lock:
            return {m.name: sorted(m.available()) for m in self._models.values()}
