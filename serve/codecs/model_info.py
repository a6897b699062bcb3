"""GetModelMetadata and GetModelStatus, one implementation for both APIs (as TF Serving's
get_model_metadata_impl and get_model_status_impl): TF Serving's messages built from what the
core's model manager knows. gRPC answers with them, REST builds the same request from its URL
and renders the answer as JSON. A ModelSpec message read as the core's ModelSpec: `spec_of`, and
written from one: `fill_spec`."""

from __future__ import annotations

from tensorflow.core.protobuf import error_codes_pb2
from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2

from tfpipe.serve.codecs.tensor_proto import model_spec
from tfpipe.serve.core.manager import ModelManager, ModelSpec
from tfpipe.serve.errors import invalid, quoted


def spec_of(spec, named: bool = True) -> ModelSpec:
    """A ModelSpec message as the core's; `named`: an empty name is INVALID_ARGUMENT here."""
    if named and not spec.name:
        raise invalid("ModelSpec has no name specified.")
    choice = spec.WhichOneof("version_choice")
    return ModelSpec(spec.name, spec.version.value if choice == "version" else None,
                     spec.version_label if choice == "version_label" else None)


def fill_spec(into, spec: ModelSpec) -> None:
    """A request's ModelSpec message from the core's (a REST request's, for its log)."""
    into.name = spec.name
    if spec.version is not None:
        into.version.value = spec.version
    if spec.label:
        into.version_label = spec.label


def metadata_response(manager: ModelManager, request) -> get_model_metadata_pb2.GetModelMetadataResponse:
    name, version, label = spec_of(request.model_spec)
    fields = list(request.metadata_field)
    if not fields:
        raise invalid("GetModelMetadataRequest must specify at least one metadata_field")
    for f in fields:
        if f != "signature_def":
            raise invalid(f"Metadata field {quoted(f)} is not supported")
    servable = manager.resolve(name, version, label)
    response = get_model_metadata_pb2.GetModelMetadataResponse()
    model_spec(response.model_spec, name, servable.version, "")
    sig_map = get_model_metadata_pb2.SignatureDefMap()
    for k, v in servable.signature_defs.items():
        sig_map.signature_def[k].CopyFrom(v)
    response.metadata["signature_def"].Pack(sig_map)
    return response


def status_response(manager: ModelManager, request) -> get_model_status_pb2.GetModelStatusResponse:
    name, version, label = spec_of(request.model_spec)
    response = get_model_status_pb2.GetModelStatusResponse()
    for s in manager.status(name, version, label):
        st = response.model_version_status.add(version=s.version)
        st.state = get_model_status_pb2.ModelVersionStatus.State.Value(s.state)
        st.status.error_code = error_codes_pb2.Code.Value(s.error_code)
        st.status.error_message = s.error_message
    return response
