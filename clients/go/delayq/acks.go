package delayq

// Batched acks of one Consume stream (issue 12): a unary call costs the
// server about 1 ms of CPU, so at 1,000 jobs/s one Ack per job is most of
// its CPU. Finished deliveries gather for AckLinger and go out in one call
// (at most maxTokensPerCall tokens, at most maxAckCalls calls in flight;
// acks that finish while due ones wait for a call slot join them). No
// linger when the stream has no credit left (the server holds the next
// delivery until these acks arrive), when a call would be full, or while
// shutting down. Mirrors the Python Worker (_queue_ack and friends).

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/delayq/delayq/clients/go/delayqv1"
)

// maxAckCalls is how many Ack calls of one stream may be in flight.
const maxAckCalls = 2

type acker struct {
	rpc      delayqv1.DelayQueueServiceClient
	linger   time.Duration // <= 0: no linger
	credit   int           // the stream's max_outstanding
	running  func() int    // deliveries holding a handler slot, the one being acked included
	stopping <-chan struct{}
	onError  func(*delayqv1.Delivery, error)

	mu      sync.Mutex
	pending []*delayqv1.Delivery
	sending int  // tokens in Ack calls under way
	calls   int  // Ack calls under way
	due     bool // the pending acks lingered long enough: send them
	timer   *time.Timer
	wg      sync.WaitGroup
}

func newAcker(rpc delayqv1.DelayQueueServiceClient, opts ConsumeOptions, running func() int, stopping <-chan struct{}) *acker {
	return &acker{
		rpc: rpc, linger: opts.AckLinger, credit: opts.Concurrency,
		running: running, stopping: stopping, onError: opts.OnError,
	}
}

// add queues the ack of a delivery whose handler succeeded.
func (a *acker) add(d *delayqv1.Delivery) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending = append(a.pending, d)
	// The server counts a delivery as outstanding until its ack arrives.
	outstanding := a.running() - 1 + len(a.pending) + a.sending
	switch {
	case a.linger <= 0, len(a.pending) >= maxTokensPerCall, outstanding >= a.credit, a.isStopping():
		a.flushLocked()
	case a.timer == nil && !a.due:
		var t *time.Timer
		t = time.AfterFunc(a.linger, func() {
			a.mu.Lock()
			defer a.mu.Unlock()
			if a.timer == t { // not stopped too late by a flush
				a.flushLocked()
			}
		})
		a.timer = t
	}
}

func (a *acker) isStopping() bool {
	select {
	case <-a.stopping:
		return true
	default:
		return false
	}
}

// flushLocked makes the pending acks due: they go as call slots free up.
func (a *acker) flushLocked() {
	if a.timer != nil {
		a.timer.Stop()
		a.timer = nil
	}
	a.due = true
	a.kickLocked()
}

func (a *acker) kickLocked() {
	for len(a.pending) > 0 && a.due && a.calls < maxAckCalls {
		n := min(len(a.pending), maxTokensPerCall)
		batch := a.pending[:n:n]
		a.pending = a.pending[n:]
		a.calls++
		a.sending += n
		a.wg.Add(1)
		go a.send(batch)
	}
	if len(a.pending) == 0 {
		a.pending = nil
		a.due = false // the next ack starts a new linger
	}
}

// send makes one Ack call and reports each delivery's outcome.
func (a *acker) send(batch []*delayqv1.Delivery) {
	defer a.wg.Done()
	tokens := make([]string, len(batch))
	for i, d := range batch {
		tokens[i] = d.GetLeaseToken()
	}
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	resp, err := a.rpc.Ack(ctx, &delayqv1.AckRequest{LeaseTokens: tokens})
	cancel()
	a.mu.Lock()
	a.calls--
	a.sending -= len(batch)
	a.kickLocked()
	a.mu.Unlock()
	results := resp.GetResults()
	if err == nil && len(results) != len(batch) {
		err = fmt.Errorf("%d results for %d tokens", len(results), len(batch))
	}
	for i, d := range batch {
		switch {
		case err != nil:
			a.onError(d, fmt.Errorf("delayq: ack: %w", err))
		case results[i] != delayqv1.AckResult_ACK_RESULT_ACKED:
			a.onError(d, fmt.Errorf("delayq: ack not applied: %v", results[i]))
		}
	}
}

// close sends the acks still lingering and waits for every Ack call (each
// bounded by settleTimeout). Call it once no handler can add more.
func (a *acker) close() {
	a.mu.Lock()
	a.flushLocked()
	a.mu.Unlock()
	a.wg.Wait()
}
