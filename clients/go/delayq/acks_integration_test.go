//go:build integration

package delayq_test

// Ack batching against the real server: it enforces the stream's credit
// (max_outstanding), and its queue stats show which acks landed.

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayq/delayq/clients/go/delayq"
	"github.com/delayq/delayq/clients/go/delayqv1"
)

func enqueueN(t *testing.T, c *delayq.Client, queue string, n int) {
	t.Helper()
	for range n {
		if _, err := c.Enqueue(context.Background(), queue, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
}

// closeAfter is a handler that succeeds and closes done at its n-th delivery.
func closeAfter(n int32, done chan struct{}) delayq.Handler {
	var handled atomic.Int32
	return func(context.Context, *delayqv1.Delivery) error {
		if handled.Add(1) == n {
			close(done)
		}
		return nil
	}
}

func ackedTotal(t *testing.T, c *delayq.Client, queue string) uint64 {
	t.Helper()
	st, err := c.Service().GetQueueStats(context.Background(), &delayqv1.GetQueueStatsRequest{Queue: queue})
	if err != nil {
		t.Fatal(err)
	}
	return st.GetStats().GetAckedTotal()
}

// With no credit left the next delivery waits for the ack, so it must not
// linger: a one-hour linger would otherwise stall the worker after one job.
func TestWorkerWithoutSpareCreditDoesNotWaitForLinger(t *testing.T) {
	c := dial(t)
	queue := queueName(t)
	enqueueN(t, c, queue, 5)
	done := make(chan struct{})
	var errs errorLog
	opts := delayq.ConsumeOptions{Queues: []string{queue}, Concurrency: 1, AckLinger: time.Hour, OnError: errs.add}
	consumeUntil(t, c, opts, closeAfter(5, done), done)
	if got := ackedTotal(t, c, queue); got != 5 {
		t.Errorf("acked_total = %d, want 5", got)
	}
	if e := errs.get(); len(e) != 0 {
		t.Errorf("OnError: %v", e)
	}
}

// A drain sends the acks still lingering before Consume returns, with the
// release grace (acks over unary calls after the stream closed) and without
// one (acks must land before the stream closes, which releases its leases).
func TestShutdownSendsLingeringAcksBeforeReturning(t *testing.T) {
	for _, tc := range []struct {
		name  string
		grace time.Duration
	}{{"with grace", 0}, {"without grace", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t)
			queue := queueName(t)
			enqueueN(t, c, queue, 3)
			allDone := make(chan struct{})
			var errs errorLog
			opts := delayq.ConsumeOptions{
				Queues: []string{queue}, Concurrency: 10, AckLinger: time.Hour,
				ReleaseGrace: tc.grace, OnError: errs.add,
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			result := make(chan error, 1)
			go func() {
				result <- c.Consume(ctx, opts, closeAfter(3, allDone))
			}()
			select {
			case <-allDone:
			case <-time.After(20 * time.Second):
				t.Fatal("3 jobs not handled within 20s")
			}
			// Credit to spare (10 > 3): the acks linger.
			if got := ackedTotal(t, c, queue); got != 0 {
				t.Errorf("acked_total = %d before shutdown, want 0 (lingering)", got)
			}
			cancel()
			if err := <-result; err != nil {
				t.Fatal(err)
			}
			if got := ackedTotal(t, c, queue); got != 3 {
				t.Errorf("acked_total = %d when Consume returned, want 3", got)
			}
			if e := errs.get(); len(e) != 0 {
				t.Errorf("OnError: %v", e)
			}
		})
	}
}
