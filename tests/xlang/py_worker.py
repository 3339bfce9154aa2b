"""Cross-language test worker: consumes deliveries with the generated stubs and acks them.

Prints one JSON line per delivery (job id, attempt, headers, base64 payload,
ack result) and exits once --count deliveries are acked, or fails after
--timeout seconds. Run by tests/xlang/xlang_test.go; it uses the wire
contract only, not the ergonomic Python client.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys

import grpc

from delayq.v1 import service_pb2, service_pb2_grpc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", required=True, help="host:port of the delayq server")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=20.0)
    args = parser.parse_args()

    acked = 0
    with grpc.insecure_channel(args.addr) as channel:
        stub = service_pb2_grpc.DelayQueueServiceStub(channel)
        request = service_pb2.ConsumeRequest(queues=[args.queue], max_outstanding=1)
        stream = stub.Consume(request, timeout=args.timeout)
        try:
            for response in stream:
                for delivery in response.deliveries:
                    ack = stub.Ack(
                        service_pb2.AckRequest(lease_tokens=[delivery.lease_token]), timeout=10
                    )
                    line = {
                        "job_id": delivery.job.id,
                        "attempt": delivery.attempt,
                        "headers": dict(delivery.job.headers),
                        "payload_b64": base64.b64encode(delivery.job.payload).decode(),
                        "ack": service_pb2.AckResult.Name(ack.results[0]),
                    }
                    print(json.dumps(line), flush=True)
                    acked += 1
                if acked >= args.count:
                    return 0
        except grpc.RpcError as err:
            print(f"py_worker: {err.code()}: {err.details()}", file=sys.stderr)
            return 1
    print(f"py_worker: stream ended after {acked} of {args.count} deliveries", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
