"""Promotions and rollbacks for a server that runs a models.config with version labels: TF Serving's
`specific` version policy and `version_labels`, which `tensorflow_model_server` and tfpipe's own
server both understand.

A label may only name a version the server has loaded (TF Serving answers FAILED_PRECONDITION
otherwise, unless it runs with --allow_version_labels_for_unavailable_models), so moving `stable`
from version S to N is two configs: first both versions with `stable` still on S (N loads while S
serves), then, once N is AVAILABLE, N alone with `stable` on N (S unloads). With `--server`, the
command sends each config to the running server (ModelService.HandleReloadConfigRequest) and waits
for N in between; the file is rewritten at each step too (atomically), so that a restart serves
what the running server does. Without a server it writes the final config, for a server started
on it (which loads every version before it applies labels).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tfpipe.files import write_atomic
from tfpipe.rollout.errors import RolloutError

STABLE = "stable"


def read_config(path: str):
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    try:
        with open(path) as f:
            return text_format.Parse(f.read(), model_server_config_pb2.ModelServerConfig())
    except OSError as e:
        raise RolloutError(f"cannot read {path}: {e.strerror}") from None
    except text_format.ParseError as e:
        raise RolloutError(f"{path} is not a ModelServerConfig text proto: {e}") from None


def pinned(config, name: str, versions: list[int], labels: dict[str, int]):
    """A copy of `config` whose model `name` serves exactly `versions` (a `specific` policy) with
    these labels (its other labels dropped: they may name versions no longer served)."""
    out = type(config)()
    out.CopyFrom(config)
    entries = [c for c in out.model_config_list.config if c.name == name]
    if not entries:
        names = ", ".join(c.name for c in out.model_config_list.config) or "none"
        raise RolloutError(f"the models config has no model {name!r} (models: {names})")
    entry = entries[0]
    entry.model_version_policy.Clear()
    entry.model_version_policy.specific.versions.extend(sorted(set(versions)))
    entry.version_labels.clear()
    for label, version in labels.items():
        entry.version_labels[label] = version
    return out


def write_config(path: str, config) -> None:
    from google.protobuf import text_format

    write_atomic(path, text_format.MessageToString(config))


# TF Serving's refusal of a label for a version it has not loaded: with `tfpipe serve --workers N`
# the new version may be loaded on the worker that answered the status check and not yet on the
# one this connection reaches, so the label's move is sent again, on a new connection, for a while.
_NOT_LOADED_YET = "which is not currently available for inference"


def reload(server: str, config, timeout: float = 120) -> None:
    """Send `config` to the server at HOST:PORT (gRPC), as `tensorflow_model_server` takes it; sent
    again while the server says a labelled version is not loaded yet, up to `timeout` s."""
    import grpc
    from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc

    deadline = time.monotonic() + timeout
    while True:
        with grpc.insecure_channel(server, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            try:
                answer = model_service_pb2_grpc.ModelServiceStub(channel).HandleReloadConfigRequest(
                    model_management_pb2.ReloadConfigRequest(config=config),
                    timeout=max(1.0, deadline - time.monotonic()))
            except grpc.RpcError as e:
                if (e.code() == grpc.StatusCode.FAILED_PRECONDITION and _NOT_LOADED_YET in (e.details() or "")
                        and time.monotonic() < deadline):
                    time.sleep(0.2)
                    continue
                raise RolloutError(f"the server at {server} refused the config: {e.code().name}: {e.details()}") \
                    from None
        break
    if answer.status.error_code:
        raise RolloutError(f"the server at {server} refused the config: {answer.status.error_message}")


def wait_available(server: str, name: str, version: int, timeout: float = 120) -> None:
    """Until the server reports `version` of `name` AVAILABLE (RolloutError after `timeout` s)."""
    import grpc
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    request.model_spec.version.value = version
    deadline, state = time.monotonic() + timeout, "not listed"
    with grpc.insecure_channel(server) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        while time.monotonic() < deadline:
            try:
                status = stub.GetModelStatus(request, timeout=10).model_version_status
            except grpc.RpcError as e:
                state = f"{e.code().name}: {e.details()}"
            else:
                if status:
                    state = get_model_status_pb2.ModelVersionStatus.State.Name(status[0].state)
                    if state == "AVAILABLE":
                        return
            time.sleep(0.2)
    raise RolloutError(f"version {version} of {name} did not become AVAILABLE on {server} within {timeout:.0f}s "
                       f"(last: {state}); the server keeps serving the other version")


def move_stable(path: str, name: str, old: int | None, new: int, server: str | None,
                log: Callable[[str], None], label: str = STABLE) -> None:
    """Serve `new` in place of `old` (the version the file gives `label`, if it labels one) through
    the models.config at `path` (and the running server at `server`), moving `label` after `new` is
    loaded."""
    config = read_config(path)
    final = pinned(config, name, [new], {label: new})  # also checks that the file has the model
    labelled = {c.name: dict(c.version_labels) for c in config.model_config_list.config}[name].get(label)
    old = labelled if labelled is not None else old  # what the server runs is what the file says
    if server is None or old is None or old == new:
        write_config(path, final)
        if server is not None:
            reload(server, final)
        log(f"{path}: {name} serves version {new} ({label}) alone")
        return
    both = pinned(config, name, [old, new], {label: old})
    write_config(path, both)
    reload(server, both)
    log(f"{path}: {name} loads version {new} beside {old} ({label} stays on {old})")
    wait_available(server, name, new)
    write_config(path, final)
    reload(server, final)
    log(f"{path}: {name} serves version {new} ({label}) alone")
