package delayq

// Client-side batching of concurrent Enqueue calls (issue 12; the rules are
// in docs/decisions.md): a call made while no batch call is in flight goes
// out at once, so a lone caller is never delayed; calls made while one is in
// flight gather until it returns, MaxDelay passes, or MaxItems jobs or
// MaxBytes bytes wait, and then travel together: as one message on an
// EnqueueStream (enqueue_stream.go), or as one EnqueueBatch call.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/delayq/delayq/clients/go/delayqv1"
)

// BatchSettings says how concurrent Enqueue calls are gathered; zero fields
// take the defaults (5 ms, 500 jobs, 1 MiB).
type BatchSettings struct {
	// Disabled sends one Enqueue RPC per call.
	Disabled bool
	// UnaryCalls sends one EnqueueBatch call per batch instead of a message
	// on one long-lived EnqueueStream (the default), for load balancers that
	// spread calls one by one over replicas: a stream stays on one.
	UnaryCalls bool
	// MaxDelay is the longest a call waits for company while another batch
	// call is in flight.
	MaxDelay time.Duration
	// MaxItems is the most jobs per EnqueueBatch call (at most 1000).
	MaxItems int
	// MaxBytes is the most encoded request bytes per call (at most 3 MiB).
	MaxBytes int
}

// ErrClientClosed is returned by Enqueue after Close.
var ErrClientClosed = errors.New("delayq: client is closed")

func (s BatchSettings) withDefaults() BatchSettings {
	if s.MaxDelay <= 0 {
		s.MaxDelay = 5 * time.Millisecond
	}
	if s.MaxItems <= 0 || s.MaxItems > 1000 {
		s.MaxItems = 500
	}
	if s.MaxBytes <= 0 || s.MaxBytes > 3<<20 {
		s.MaxBytes = 1 << 20
	}
	return s
}

type outcome struct {
	resp *delayqv1.EnqueueResponse
	err  error
}

type batchItem struct {
	req  *delayqv1.EnqueueRequest
	size int
	// deadline of the caller's context (zero: none).
	deadline time.Time
	done     chan outcome
}

type batcher struct {
	rpc      delayqv1.DelayQueueServiceClient
	settings BatchSettings
	stream   enqueueStream

	mu       sync.Mutex
	pending  []*batchItem
	bytes    int
	inFlight int
	timer    *time.Timer
	closed   bool
	wg       sync.WaitGroup
}

func newBatcher(rpc delayqv1.DelayQueueServiceClient, s BatchSettings) *batcher {
	return &batcher{rpc: rpc, settings: s.withDefaults(), stream: enqueueStream{rpc: rpc}}
}

// enqueue sends req with others, or alone when the caller's context carries
// outgoing metadata (a batch call could carry only one caller's).
func (b *batcher) enqueue(ctx context.Context, req *delayqv1.EnqueueRequest) (*delayqv1.EnqueueResponse, error) {
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md) > 0 {
		return b.rpc.Enqueue(ctx, req)
	}
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	it := &batchItem{req: req, size: proto.Size(req) + 8, done: make(chan outcome, 1)}
	if d, ok := ctx.Deadline(); ok {
		it.deadline = d
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, ErrClientClosed
	}
	if len(b.pending) > 0 && b.bytes+it.size > b.settings.MaxBytes {
		b.flushLocked()
	}
	b.pending = append(b.pending, it)
	b.bytes += it.size
	switch {
	case len(b.pending) >= b.settings.MaxItems || b.bytes >= b.settings.MaxBytes || b.inFlight == 0:
		b.flushLocked()
	case b.timer == nil:
		b.timer = time.AfterFunc(b.settings.MaxDelay, b.flush)
	}
	b.mu.Unlock()
	select {
	case o := <-it.done:
		return o.resp, o.err
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

func (b *batcher) flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
}

func (b *batcher) flushLocked() {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	items := b.pending
	b.pending, b.bytes = nil, 0
	if len(items) == 0 {
		return
	}
	b.inFlight++
	b.wg.Add(1)
	go b.run(items)
}

func (b *batcher) run(items []*batchItem) {
	defer b.wg.Done()
	ctx, cancel := callContext(items)
	defer cancel()
	outs := b.send(ctx, items)
	for i, it := range items {
		it.done <- outs[i]
	}
	b.mu.Lock()
	b.inFlight--
	// Group commit: whatever gathered while this call was out goes now.
	if b.inFlight == 0 && len(b.pending) > 0 {
		b.flushLocked()
	}
	b.mu.Unlock()
}

// callContext bounds the batch call by the latest caller deadline (none if
// any caller has none): each caller still stops waiting at its own.
func callContext(items []*batchItem) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, it := range items {
		if it.deadline.IsZero() {
			return context.WithCancel(context.Background())
		}
		if it.deadline.After(latest) {
			latest = it.deadline
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// send stores the batch as one message on the EnqueueStream, or (calls, or a
// server without the stream) one Enqueue for a lone job, else one
// EnqueueBatch, and answers per job: a per-item BatchError becomes that
// caller's status error, an error of the call, stream or whole batch fails
// every job of it.
func (b *batcher) send(ctx context.Context, items []*batchItem) []outcome {
	reqs := make([]*delayqv1.EnqueueRequest, len(items))
	for i, it := range items {
		reqs[i] = it.req
	}
	if !b.settings.UnaryCalls && !b.stream.unsupported.Load() {
		resp, err := b.stream.send(ctx, reqs)
		if !errors.Is(err, errStreamUnsupported) {
			if e := resp.GetError(); err == nil && e != nil {
				err = status.Error(codes.Code(e.GetCode()), e.GetMessage())
			}
			return answers(items, resp.GetResults(), err, "EnqueueStream")
		}
	}
	if len(items) == 1 {
		resp, err := b.rpc.Enqueue(ctx, items[0].req)
		return []outcome{{resp, err}}
	}
	resp, err := b.rpc.EnqueueBatch(ctx, &delayqv1.EnqueueBatchRequest{Requests: reqs})
	return answers(items, resp.GetResults(), err, "EnqueueBatch")
}

// answers gives each job its own result, or every job the error.
func answers(items []*batchItem, results []*delayqv1.EnqueueBatchResult, err error, method string) []outcome {
	outs := make([]outcome, len(items))
	if err == nil && len(results) != len(items) {
		err = status.Error(codes.Internal, fmt.Sprintf(
			"%s answered %d results for %d jobs", method, len(results), len(items)))
	}
	for i := range items {
		switch {
		case err != nil:
			outs[i] = outcome{err: err}
		case results[i].GetError() != nil:
			e := results[i].GetError()
			outs[i] = outcome{err: status.Error(codes.Code(e.GetCode()), e.GetMessage())}
		default:
			outs[i] = outcome{resp: results[i].GetResponse()}
		}
	}
	return outs
}

// close sends what is gathering and waits for every call in flight.
func (b *batcher) close() {
	b.mu.Lock()
	b.closed = true
	b.flushLocked()
	b.mu.Unlock()
	b.wg.Wait()
	b.stream.close()
}
