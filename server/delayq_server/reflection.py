"""gRPC reflection served from descriptors with source info, so clients see comments.

grpc_reflection's servicer answers from the process' descriptor pool, whose
descriptors carry no comments (CopyToProto drops source info) and whose symbol
lookup does not know methods: `grpcurl describe Service.Method` failed with
"Symbol not found" and `describe` printed no comments. `make proto` writes
descriptors.binpb (protoc --include_source_info --include_imports); delayq's
files, and every symbol in them down to methods, fields and enum values, are
answered from it. Other services (health, reflection) fall back to the pool.
docs/decisions.md, "Reflection with comments".
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from typing import Any

import grpc
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha._async import ReflectionServicer

DESCRIPTORS = "descriptors.binpb"


def _symbols(fdp: descriptor_pb2.FileDescriptorProto) -> Iterable[str]:
    """Every fully-qualified name a file defines (what file_containing_symbol may ask)."""
    pkg = f"{fdp.package}." if fdp.package else ""

    def message(msg: descriptor_pb2.DescriptorProto, scope: str) -> Iterable[str]:
        name = f"{scope}{msg.name}"
        yield name
        for field in (*msg.field, *msg.extension):
            yield f"{name}.{field.name}"
        for oneof in msg.oneof_decl:
            yield f"{name}.{oneof.name}"
        for nested in msg.nested_type:
            yield from message(nested, f"{name}.")
        for enum in msg.enum_type:
            yield from enum_names(enum, f"{name}.")

    def enum_names(enum: descriptor_pb2.EnumDescriptorProto, scope: str) -> Iterable[str]:
        yield f"{scope}{enum.name}"
        # Enum values are scoped like siblings of their enum (protobuf rule).
        for value in enum.value:
            yield f"{scope}{value.name}"

    for msg in fdp.message_type:
        yield from message(msg, pkg)
    for enum in fdp.enum_type:
        yield from enum_names(enum, pkg)
    for svc in fdp.service:
        yield f"{pkg}{svc.name}"
        for method in svc.method:
            yield f"{pkg}{svc.name}.{method.name}"
    for ext in fdp.extension:
        yield f"{pkg}{ext.name}"


def _drop_json_names(messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
    """protoc fills json_name (lowerCamel); the pool's descriptors never had it, and
    with it grpcurl prints `jobId` instead of the proto names the README promises."""
    for msg in messages:
        for fld in (*msg.field, *msg.extension):
            fld.ClearField("json_name")
        _drop_json_names(msg.nested_type)


class DescribedReflection(ReflectionServicer):  # type: ignore[misc]
    """ReflectionServicer answering delayq's files from descriptors.binpb."""

    def __init__(self, service_names: Iterable[str], descriptor_set: bytes) -> None:
        super().__init__(tuple(service_names))
        fds = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set)
        for f in fds.file:
            _drop_json_names(f.message_type)
        self._files = {f.name: f for f in fds.file}
        self._serialized = {f.name: f.SerializeToString() for f in fds.file}
        self._by_symbol = {s: f.name for f in fds.file for s in _symbols(f)}

    def _answer(self, request: Any, name: str) -> Any:
        """The file and its transitive dependencies, each with its source info."""
        seen: list[str] = []
        todo = [name]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.append(current)
            todo.extend(d for d in self._files[current].dependency if d in self._files)
        return reflection_pb2.ServerReflectionResponse(
            file_descriptor_response=reflection_pb2.FileDescriptorResponse(
                file_descriptor_proto=[self._serialized[n] for n in seen]
            ),
            original_request=request,
        )

    def _file_by_filename(self, request: Any, filename: str) -> Any:
        if filename in self._files:
            return self._answer(request, filename)
        return super()._file_by_filename(request, filename)

    def _file_containing_symbol(self, request: Any, fully_qualified_name: str) -> Any:
        name = self._by_symbol.get(fully_qualified_name.lstrip("."))
        if name is not None:
            return self._answer(request, name)
        return super()._file_containing_symbol(request, fully_qualified_name)


def enable(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Registers reflection (v1alpha, which grpcurl and grpc_cli use) on ``server``."""
    data = resources.files("delayq_server").joinpath(DESCRIPTORS).read_bytes()
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        DescribedReflection(service_names, data), server
    )
