"""The KServe v2 gRPC front end, on grpcio with Triton's own service definition.

``tritonclient.grpc`` ships the generated ``service_pb2`` / ``service_pb2_grpc`` (package
``inference``, service ``GRPCInferenceService``); this servicer implements ServerLive,
ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelConfig, RepositoryIndex and
ModelInfer (inputs as ``raw_input_contents`` or typed ``contents``; outputs always raw).
The other methods (shared memory, streaming, tracing, load/unload) answer UNIMPLEMENTED, the
base class's default. Refusals map to gRPC codes: 400 INVALID_ARGUMENT, 404 NOT_FOUND,
503 UNAVAILABLE, 504 DEADLINE_EXCEEDED, 500 INTERNAL; messages are those of the HTTP side.
Messages above ``max_request_bytes`` are refused by grpcio itself (RESOURCE_EXHAUSTED).
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from .core import Core
from .tensors import RequestError, check_shape, datatype_of_array, from_bytes, from_values, status_of
from ..report.version import FUSEGRAPH_VERSION

log = logging.getLogger("fusegraph.serve")

_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND, 503: grpc.StatusCode.UNAVAILABLE,
          504: grpc.StatusCode.DEADLINE_EXCEEDED, 500: grpc.StatusCode.INTERNAL}
_TYPED = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
          "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
          "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents"}


def decode_infer(request: pb.ModelInferRequest) -> dict[str, np.ndarray]:
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise RequestError(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs")
    if not request.inputs:
        raise RequestError("request needs 'inputs': at least one input tensor")
    arrays = {}
    for i, tensor in enumerate(request.inputs):
        where = f"input {tensor.name!r}"
        if tensor.name in arrays:
            raise RequestError(f"{where} is given twice")
        shape = check_shape(list(tensor.shape), where)
        if raw:
            arrays[tensor.name] = from_bytes(raw[i], tensor.datatype, shape, where)
            continue
        field = _TYPED.get(tensor.datatype)
        if field is None:
            raise RequestError(f"{where}: datatype {tensor.datatype!r} needs raw_input_contents")
        values = getattr(tensor.contents, field)
        arrays[tensor.name] = from_values(np.asarray(values) if len(values) else [], tensor.datatype, shape, where)
    return arrays


class Servicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, core: Core):
        self.core = core

    def _model(self, name: str, version: str, context):
        try:
            model = self.core.model(name)
            self.core.check_version(model, version)
            return model
        except RequestError as exc:
            context.abort(_CODES[exc.status], str(exc))

    def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.core.ready)

    def ModelReady(self, request, context):
        model = self.core.models.get(request.name)
        return pb.ModelReadyResponse(ready=bool(model and model.ready.is_set() and request.version in ("", "1")))

    def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name="fusegraph", version=FUSEGRAPH_VERSION,
                                         extensions=["binary_tensor_data", "model_repository"])

    def ModelMetadata(self, request, context):
        model = self._model(request.name, request.version, context)
        meta = model.metadata()
        tensors = lambda specs: [pb.ModelMetadataResponse.TensorMetadata(**s) for s in specs]  # noqa: E731
        return pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"],
                                        inputs=tensors(meta["inputs"]), outputs=tensors(meta["outputs"]))

    def ModelConfig(self, request, context):
        model = self._model(request.name, request.version, context)
        batched = model.batch_axis is not None
        dims = lambda s: [d for i, d in enumerate(s.shape) if not (batched and i == model.batch_axis)]  # noqa: E731
        typ = lambda s: mc.DataType.Value("TYPE_STRING" if s.datatype == "BYTES" else f"TYPE_{s.datatype}")  # noqa: E731
        config = mc.ModelConfig(
            name=model.name, platform=model.platform,
            max_batch_size=model.settings.max_batch_size if batched else 0,
            input=[mc.ModelInput(name=s.name, data_type=typ(s), dims=dims(s)) for s in model.inputs],
            output=[mc.ModelOutput(name=s.name, data_type=typ(s), dims=dims(s)) for s in model.outputs],
            instance_group=[mc.ModelInstanceGroup(count=model.instance_count, kind=mc.ModelInstanceGroup.KIND_CPU)])
        return pb.ModelConfigResponse(config=config)

    def RepositoryIndex(self, request, context):
        return pb.RepositoryIndexResponse(models=[
            pb.RepositoryIndexResponse.ModelIndex(name=n, version="1", state="READY" if m.ready.is_set() else "UNAVAILABLE")
            for n, m in self.core.models.items()])

    def ModelInfer(self, request, context):
        t0 = time.perf_counter()
        name = request.model_name
        label = name if name in self.core.models else "_unknown"
        self.core.metrics.inflight.labels(label).inc()
        try:
            model = self.core.model(name)
            self.core.check_version(model, request.model_version)
            arrays = decode_infer(request)
            requested = [o.name for o in request.outputs]
            outputs = self.core.infer(name, arrays, requested, timeout=context.time_remaining())
            response = pb.ModelInferResponse(model_name=name, model_version="1", id=request.id)
            for out_name, array in outputs.items():
                array = np.ascontiguousarray(array)
                response.outputs.add(name=out_name, datatype=datatype_of_array(array), shape=list(array.shape))
                response.raw_output_contents.append(array.tobytes())
            status = 200
        except Exception as exc:  # noqa: BLE001 - every failure becomes an answer
            status, message = status_of(exc)
            log.info("request refused", extra={"model": name, "protocol": "grpc", "code": status, "reason": message})
        finally:
            self.core.metrics.inflight.labels(label).dec()
        self.core.metrics.finished(label, "grpc", time.perf_counter() - t0, status)
        if status != 200:
            context.abort(_CODES.get(status, grpc.StatusCode.INTERNAL), message)
        return response


def start_grpc(core: Core, host: str, port: int, workers: int = 16) -> tuple[grpc.Server, int]:
    """Start the gRPC server on ``host:port`` (0: any free port); returns it and the bound port."""
    limit = core.limits.max_request_bytes
    server = grpc.server(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fg-grpc"),
                         options=[("grpc.max_receive_message_length", limit),
                                  ("grpc.max_send_message_length", max(limit, 256 << 20)),
                                  ("grpc.so_reuseport", 0)])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(core), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {host}:{port}")
    server.start()
    return server, bound
