// Package delayq is a thin helper over the generated delayq.v1 gRPC client
// (package delayqv1): Enqueue with a delay or due time, and Consume, a worker
// loop that acks on success, nacks on error and renews leases while a
// handler runs. Everything else is one call away through Client.Service.
package delayq

import (
	"context"
	"errors"
	"maps"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/delayq/delayq/clients/go/delayqv1"
)

// Client talks to one delayq server (or a load balancer in front of several).
// It is safe for concurrent use.
type Client struct {
	conn      *grpc.ClientConn // owned (closed by Close) only when Dial made it
	rpc       delayqv1.DelayQueueServiceClient
	namespace string
	batch     *batcher // nil: one Enqueue RPC per call
}

// Dial connects to target ("127.0.0.1:50051", "dns:///delayq:50051").
// Without options the connection is plaintext; pass
// grpc.WithTransportCredentials to use TLS.
func Dial(target string, opts ...grpc.DialOption) (*Client, error) {
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, err
	}
	c := New(conn)
	c.conn = conn
	return c, nil
}

// New wraps a connection the caller owns; Close does not close it (but
// sends the enqueues still gathering).
//
// Batching is on: concurrent Enqueue calls travel together in one
// EnqueueBatch RPC, each caller still getting its own answer; a call made
// while no batch RPC is in flight goes out at once. See BatchSettings and
// WithBatching.
func New(cc grpc.ClientConnInterface) *Client {
	rpc := delayqv1.NewDelayQueueServiceClient(cc)
	return &Client{rpc: rpc, batch: newBatcher(rpc, BatchSettings{})}
}

// WithBatching returns a copy of the client whose Enqueue calls gather per
// s (s.Disabled: one Enqueue RPC per call). Close the copy too: it flushes
// its own batches.
func (c *Client) WithBatching(s BatchSettings) *Client {
	cp := *c
	cp.batch = nil
	if !s.Disabled {
		cp.batch = newBatcher(c.rpc, s)
	}
	return &cp
}

// WithNamespace returns a copy of the client that sends every request to ns
// (empty means the server's "default" namespace).
func (c *Client) WithNamespace(ns string) *Client {
	cp := *c
	cp.namespace = ns
	return &cp
}

// Service is the generated client, for the RPCs this package does not wrap.
func (c *Client) Service() delayqv1.DelayQueueServiceClient { return c.rpc }

// Close sends the enqueues still gathering, waits for their answers, and
// closes the connection if Dial opened it.
func (c *Client) Close() error {
	if c.batch != nil {
		c.batch.close()
	}
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// EnqueueOption sets a field of the EnqueueRequest.
type EnqueueOption func(*delayqv1.EnqueueRequest)

// WithDelay makes the job due d after the server receives it.
func WithDelay(d time.Duration) EnqueueOption {
	return func(r *delayqv1.EnqueueRequest) {
		r.Schedule = &delayqv1.EnqueueRequest_Delay{Delay: durationpb.New(d)}
	}
}

// WithDueTime makes the job due at t (server clock); a past t means now.
func WithDueTime(t time.Time) EnqueueOption {
	return func(r *delayqv1.EnqueueRequest) {
		r.Schedule = &delayqv1.EnqueueRequest_DueTime{DueTime: timestamppb.New(t)}
	}
}

// WithHeaders adds headers (trace context such as traceparent and
// tracestate, or user metadata); later options win on equal keys.
func WithHeaders(h map[string]string) EnqueueOption {
	return func(r *delayqv1.EnqueueRequest) {
		if r.Headers == nil {
			r.Headers = make(map[string]string, len(h))
		}
		maps.Copy(r.Headers, h)
	}
}

// WithTTL drops the job if it is not acked within d of enqueue.
func WithTTL(d time.Duration) EnqueueOption {
	return func(r *delayqv1.EnqueueRequest) { r.Ttl = durationpb.New(d) }
}

// WithMaxAttempts sets the deliveries allowed before the job is dead-lettered.
func WithMaxAttempts(n uint32) EnqueueOption {
	return func(r *delayqv1.EnqueueRequest) { r.MaxAttempts = n }
}

// WithIdempotencyKey makes a repeat with the same key (within the server's
// window) return the first job's id instead of storing a second job.
func WithIdempotencyKey(key string) EnqueueOption {
	return func(r *delayqv1.EnqueueRequest) { r.IdempotencyKey = key }
}

// EnqueueRequest builds the request Enqueue sends; useful for EnqueueBatch.
func (c *Client) EnqueueRequest(queue string, payload []byte, opts ...EnqueueOption) *delayqv1.EnqueueRequest {
	req := &delayqv1.EnqueueRequest{Namespace: c.namespace, Queue: queue, Payload: payload}
	for _, o := range opts {
		o(req)
	}
	return req
}

// Enqueue stores one job and returns the server's answer (job id, due time,
// and whether an idempotency key matched an earlier job). With batching on
// (the default) it may travel in one EnqueueBatch with concurrent calls; a
// refusal of this job comes back as its own status error either way.
func (c *Client) Enqueue(ctx context.Context, queue string, payload []byte, opts ...EnqueueOption) (*delayqv1.EnqueueResponse, error) {
	req := c.EnqueueRequest(queue, payload, opts...)
	if c.batch == nil {
		return c.rpc.Enqueue(ctx, req)
	}
	return c.batch.enqueue(ctx, req)
}

// ErrLeaseLost is reported (through ConsumeOptions.OnError) when the server
// refuses to extend a lease because the delivery went stale; the handler's
// context is cancelled and the delivery is neither acked nor nacked.
var ErrLeaseLost = errors.New("delayq: lease lost")

type nackError struct {
	err        error
	delay      time.Duration
	deadLetter bool
}

func (e *nackError) Error() string { return e.err.Error() }
func (e *nackError) Unwrap() error { return e.err }

// RetryAfter wraps a handler error so that the job is retried after d
// instead of the job's retry-policy backoff.
func RetryAfter(err error, d time.Duration) error {
	return &nackError{err: err, delay: d}
}

// DeadLetter wraps a handler error so that the job goes to the dead-letter
// set at once, whatever attempts it has left.
func DeadLetter(err error) error {
	return &nackError{err: err, deadLetter: true}
}

// nackRequest maps a handler error to the Nack that gives the job back.
func nackRequest(token string, err error) *delayqv1.NackRequest {
	req := &delayqv1.NackRequest{LeaseToken: token, Reason: truncate(err.Error(), maxReasonBytes)}
	var ne *nackError
	if errors.As(err, &ne) {
		req.DeadLetter = ne.deadLetter
		if ne.delay > 0 {
			req.Delay = durationpb.New(ne.delay)
		}
	}
	return req
}

// maxReasonBytes is the server's cap on NackRequest.reason.
const maxReasonBytes = 4096

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}
