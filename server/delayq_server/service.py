"""The gRPC servicer: the RPC families of delayq_server/rpc/ in one class.

Each family validates its requests, maps them to store calls and maps errors
(errors.py); what they share (collaborators, queue and job placement) lives in
rpc/base.py.
"""

from __future__ import annotations

from delayq.v1 import service_pb2_grpc
from delayq_server.rpc.consume import ConsumeRpcs
from delayq_server.rpc.enqueue_stream import EnqueueStreamRpcs
from delayq_server.rpc.jobs import JobRpcs
from delayq_server.rpc.leases import LeaseRpcs
from delayq_server.rpc.queues import QueueRpcs
from delayq_server.rpc.release import ReleaseRpcs


class DelayQueueService(
    EnqueueStreamRpcs,
    ConsumeRpcs,
    LeaseRpcs,
    ReleaseRpcs,
    JobRpcs,
    QueueRpcs,
    service_pb2_grpc.DelayQueueServiceServicer,
):
    """delayq.v1.DelayQueueService (proto/delayq/v1/service.proto)."""
