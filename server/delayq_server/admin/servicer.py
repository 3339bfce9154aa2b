"""AdminService's queue and job RPCs (issue 14): thin wrappers over QueueOps and JobOps."""

from __future__ import annotations

from typing import Any

import grpc

from delayq.v1 import admin_pb2, admin_pb2_grpc
from delayq_server import errors
from delayq_server.admin.jobs import JobOps
from delayq_server.admin.queues import QueueOps

Ctx = grpc.aio.ServicerContext[Any, Any]


class QueueAdminServicer(admin_pb2_grpc.AdminServiceServicer):
    """Mixed into AdminService; the interceptor has checked roles and namespace."""

    queue_ops: QueueOps
    job_ops: JobOps

    @errors.unary
    async def ListQueues(
        self, request: admin_pb2.ListQueuesRequest, context: Ctx
    ) -> admin_pb2.ListQueuesResponse:
        return await self.queue_ops.list_queues(request)

    @errors.unary
    async def CreateQueue(
        self, request: admin_pb2.CreateQueueRequest, context: Ctx
    ) -> admin_pb2.CreateQueueResponse:
        return await self.queue_ops.create_queue(request)

    @errors.unary
    async def GetQueue(
        self, request: admin_pb2.GetQueueRequest, context: Ctx
    ) -> admin_pb2.GetQueueResponse:
        return await self.queue_ops.get_queue(request)

    @errors.unary
    async def UpdateQueue(
        self, request: admin_pb2.UpdateQueueRequest, context: Ctx
    ) -> admin_pb2.UpdateQueueResponse:
        return await self.queue_ops.update_queue(request)

    @errors.unary
    async def DeleteQueue(
        self, request: admin_pb2.DeleteQueueRequest, context: Ctx
    ) -> admin_pb2.DeleteQueueResponse:
        return await self.queue_ops.delete_queue(request)

    @errors.unary
    async def PauseQueue(
        self, request: admin_pb2.PauseQueueRequest, context: Ctx
    ) -> admin_pb2.PauseQueueResponse:
        return await self.queue_ops.pause_queue(request)

    @errors.unary
    async def ResumeQueue(
        self, request: admin_pb2.ResumeQueueRequest, context: Ctx
    ) -> admin_pb2.ResumeQueueResponse:
        return await self.queue_ops.resume_queue(request)

    @errors.unary
    async def PurgeQueue(
        self, request: admin_pb2.PurgeQueueRequest, context: Ctx
    ) -> admin_pb2.PurgeQueueResponse:
        return await self.queue_ops.purge_queue(request)

    @errors.unary
    async def ListJobs(
        self, request: admin_pb2.ListJobsRequest, context: Ctx
    ) -> admin_pb2.ListJobsResponse:
        return await self.job_ops.list_jobs(request)

    @errors.unary
    async def RescheduleJob(
        self, request: admin_pb2.RescheduleJobRequest, context: Ctx
    ) -> admin_pb2.RescheduleJobResponse:
        return await self.job_ops.reschedule_job(request)

    @errors.unary
    async def UpdateJob(
        self, request: admin_pb2.UpdateJobRequest, context: Ctx
    ) -> admin_pb2.UpdateJobResponse:
        return await self.job_ops.update_job(request)

    @errors.unary
    async def RedriveDeadLetters(
        self, request: admin_pb2.RedriveDeadLettersRequest, context: Ctx
    ) -> admin_pb2.RedriveDeadLettersResponse:
        return await self.job_ops.redrive(request)
