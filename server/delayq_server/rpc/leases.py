"""Ack, Nack and ExtendLease: answers to a delivery, fenced by its lease token."""

from __future__ import annotations

import logging

from delayq.v1 import service_pb2
from delayq_server import convert, errors, logs, validation
from delayq_server.rpc.base import Ctx, ServicerBase
from delayq_server.store import (
    AckOutcome,
    JobState,
    StaleLease,
    UnknownJob,
)

_ACK_RESULT = {
    AckOutcome.ACKED: service_pb2.ACK_RESULT_ACKED,
    AckOutcome.STALE: service_pb2.ACK_RESULT_STALE,
    AckOutcome.UNKNOWN: service_pb2.ACK_RESULT_UNKNOWN,
}


log = logging.getLogger(__name__)


class LeaseRpcs(ServicerBase):
    """Mixed into DelayQueueService."""

    @errors.unary
    async def Ack(self, request: service_pb2.AckRequest, context: Ctx) -> service_pb2.AckResponse:
        tokens = validation.tokens(list(request.lease_tokens))
        codes = await self.per_shard(tokens, self._store.ack)
        acked = [t for t, c in zip(tokens, codes, strict=True) if c == AckOutcome.ACKED]
        await self._dispatcher.credit(acked)
        if len(acked) < len(tokens):
            # A late answer for a lease that ran out frees the slot its stream kept
            # (Dispatcher.on_reaped); the job id must match, so forged tokens free nothing.
            await self._dispatcher.answered(
                [t for t, c in zip(tokens, codes, strict=True) if c != AckOutcome.ACKED]
            )
        if self._tel.metering:
            self._tel.on_acked([(t.keys, t.job_id) for t in acked])
        return service_pb2.AckResponse(results=[_ACK_RESULT[c] for c in codes])

    @errors.unary
    async def Nack(
        self, request: service_pb2.NackRequest, context: Ctx
    ) -> service_pb2.NackResponse:
        token = validation.token("lease_token", request.lease_token)
        delay = validation.nack_delay(request)
        try:
            outcome = await self._store.nack(
                token.keys,
                token.ref,
                delay_ms=delay,
                dead_letter=request.dead_letter,
                reason=request.reason,
            )
        except (StaleLease, UnknownJob):
            await self._dispatcher.answered([token])  # a late answer: see Ack
            raise
        await self._dispatcher.credit([token])
        dead = outcome.state == JobState.DEAD
        if self._tel.metering:
            self._tel.on_nacked(token.keys, dead)
        if dead:
            logs.event(
                log, "dead_lettered", "job dead-lettered", namespace=token.keys.namespace,
                queue=token.keys.queue, job_id=token.job_id,
                reason=request.reason or ("nack" if request.dead_letter else "attempts exhausted"),
            )  # fmt: skip
        resp = service_pb2.NackResponse(state=int(outcome.state))  # type: ignore[arg-type]
        if outcome.due_ms:
            resp.due_time.CopyFrom(convert.ts(outcome.due_ms))
        return resp

    @errors.unary
    async def ExtendLease(
        self, request: service_pb2.ExtendLeaseRequest, context: Ctx
    ) -> service_pb2.ExtendLeaseResponse:
        token = validation.token("lease_token", request.lease_token)
        ext = validation.extension(request)
        try:
            deadline = await self._store.extend(token.keys, token.ref, ext)
        except (StaleLease, UnknownJob):
            await self._dispatcher.answered([token])  # the client learns it lost the lease
            raise
        # A closed stream in its release grace must not release an extended lease.
        await self._dispatcher.keep([token])
        return service_pb2.ExtendLeaseResponse(lease_deadline=convert.ts(deadline))
