"""Query and Delete: one job by its id."""

from __future__ import annotations

from delayq.v1 import service_pb2
from delayq_server import convert, errors, ids
from delayq_server.rpc.base import Ctx, ServicerBase
from delayq_server.store import (
    UnknownJob,
)


class JobRpcs(ServicerBase):
    """Mixed into DelayQueueService."""

    @errors.unary
    async def Query(
        self, request: service_pb2.QueryRequest, context: Ctx
    ) -> service_pb2.QueryResponse:
        keys = await self._job(request.namespace, request.queue, request.job_id)
        try:
            rec, now = await self._store.get(keys, request.job_id)
        except UnknownJob:
            raise self._not_found(keys, request.job_id) from None
        return service_pb2.QueryResponse(job=convert.job(keys, request.job_id, rec, now))

    @errors.unary
    async def Delete(
        self, request: service_pb2.DeleteRequest, context: Ctx
    ) -> service_pb2.DeleteResponse:
        keys = await self._job(request.namespace, request.queue, request.job_id)
        try:
            state, nonce = await self._store.delete(keys, request.job_id)
        except UnknownJob:
            raise self._not_found(keys, request.job_id) from None
        if nonce:  # a deleted lease gives its stream the credit back
            await self._dispatcher.credit([ids.LeaseToken(keys, request.job_id, nonce)])
        return service_pb2.DeleteResponse(previous_state=int(state))  # type: ignore[arg-type]
