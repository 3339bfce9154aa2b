//go:build integration

package delayq_test

// Integration tests against a real server: `make test-go` runs them through
// scripts/with_server.py, which exports DELAYQ_ADDR.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/delayq/delayq/clients/go/delayq"
	"github.com/delayq/delayq/clients/go/delayqv1"
)

func dial(t *testing.T) *delayq.Client {
	t.Helper()
	addr := os.Getenv("DELAYQ_ADDR")
	if addr == "" {
		t.Fatal("DELAYQ_ADDR is not set: run through scripts/with_server.py (make test-go)")
	}
	c, err := delayq.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func queueName(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "go-" + hex.EncodeToString(b)
}

// errorLog collects what Consume reports through OnError.
type errorLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorLog) add(_ *delayqv1.Delivery, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err)
}

func (l *errorLog) get() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]error(nil), l.errs...)
}

// consumeUntil runs Consume until done is closed (failing after 20s), then
// stops it and waits for it to return.
func consumeUntil(t *testing.T, c *delayq.Client, opts delayq.ConsumeOptions, h delayq.Handler, done <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	result := make(chan error, 1)
	go func() { result <- c.Consume(ctx, opts, h) }()
	select {
	case <-done:
	case err := <-result:
		t.Fatalf("Consume returned early: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("condition not reached within 20s")
	}
	cancel()
	if err := <-result; err != nil {
		t.Fatal(err)
	}
}

// waitSettled polls until the job is completed (or gone, without retention).
func waitSettled(t *testing.T, c *delayq.Client, queue, id string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, err := c.Service().Query(context.Background(), &delayqv1.QueryRequest{Queue: queue, JobId: id})
		if status.Code(err) == codes.NotFound || res.GetJob().GetState() == delayqv1.JobState_JOB_STATE_COMPLETED {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s still %v after 5s", id, res.GetJob().GetState())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestDelayedJobArrivesWithHeadersNotEarlyAndIsAcked(t *testing.T) {
	c := dial(t)
	queue := queueName(t)
	headers := map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "acme"}
	const delay = 300 * time.Millisecond
	sent := time.Now()
	res, err := c.Enqueue(context.Background(), queue, []byte(`{"to":"a@example.com"}`), delayq.WithDelay(delay), delayq.WithHeaders(headers))
	if err != nil {
		t.Fatal(err)
	}
	var got *delayqv1.Delivery
	var elapsed time.Duration
	done := make(chan struct{})
	var errs errorLog
	consumeUntil(t, c, delayq.ConsumeOptions{Queues: []string{queue}, OnError: errs.add}, func(_ context.Context, d *delayqv1.Delivery) error {
		elapsed = time.Since(sent)
		got = d
		close(done)
		return nil
	}, done)
	waitSettled(t, c, queue, res.GetJobId())
	if got.GetJob().GetId() != res.GetJobId() || got.GetAttempt() != 1 || string(got.GetJob().GetPayload()) != `{"to":"a@example.com"}` {
		t.Errorf("delivery = %v", got)
	}
	for k, v := range headers {
		if got.GetJob().GetHeaders()[k] != v {
			t.Errorf("header %s = %q, want %q", k, got.GetJob().GetHeaders()[k], v)
		}
	}
	if elapsed < delay-2*time.Millisecond {
		t.Errorf("delivered %v after enqueue, delay %v", elapsed, delay)
	}
	if e := errs.get(); len(e) != 0 {
		t.Errorf("OnError: %v", e)
	}
}

func TestFailedHandlerIsRetriedThenAcked(t *testing.T) {
	c := dial(t)
	queue := queueName(t)
	res, err := c.Enqueue(context.Background(), queue, []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	var attempts []uint32
	done := make(chan struct{})
	var errs errorLog
	consumeUntil(t, c, delayq.ConsumeOptions{Queues: []string{queue}, OnError: errs.add}, func(_ context.Context, d *delayqv1.Delivery) error {
		attempts = append(attempts, d.GetAttempt())
		if d.GetAttempt() == 1 {
			return delayq.RetryAfter(errors.New("transient"), 50*time.Millisecond)
		}
		close(done)
		return nil
	}, done)
	waitSettled(t, c, queue, res.GetJobId())
	if len(attempts) != 2 || attempts[0] != 1 || attempts[1] != 2 {
		t.Errorf("attempts = %v, want [1 2]", attempts)
	}
	if e := errs.get(); len(e) != 0 {
		t.Errorf("OnError: %v", e)
	}
}

func TestDeadLetterErrorSendsJobToDeadSet(t *testing.T) {
	c := dial(t)
	queue := queueName(t)
	res, err := c.Enqueue(context.Background(), queue, []byte("poison"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	consumeUntil(t, c, delayq.ConsumeOptions{Queues: []string{queue}}, func(_ context.Context, _ *delayqv1.Delivery) error {
		defer close(done)
		return delayq.DeadLetter(errors.New("cannot parse payload"))
	}, done)
	deadline := time.Now().Add(5 * time.Second)
	for {
		q, err := c.Service().Query(context.Background(), &delayqv1.QueryRequest{Queue: queue, JobId: res.GetJobId()})
		if err != nil {
			t.Fatal(err)
		}
		if q.GetJob().GetState() == delayqv1.JobState_JOB_STATE_DEAD {
			if q.GetJob().GetLastError() != "cannot parse payload" {
				t.Errorf("last_error = %q", q.GetJob().GetLastError())
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job state %v after 5s, want DEAD", q.GetJob().GetState())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestLeaseIsRenewedWhileSlowHandlerRuns(t *testing.T) {
	c := dial(t)
	queue := queueName(t)
	res, err := c.Enqueue(context.Background(), queue, []byte("slow"))
	if err != nil {
		t.Fatal(err)
	}
	var attempts []uint32
	done := make(chan struct{})
	var errs errorLog
	opts := delayq.ConsumeOptions{Queues: []string{queue}, LeaseDuration: time.Second, RenewEvery: 250 * time.Millisecond, OnError: errs.add}
	consumeUntil(t, c, opts, func(ctx context.Context, d *delayqv1.Delivery) error {
		attempts = append(attempts, d.GetAttempt())
		// Simulated work that outlives the first lease by half a second.
		select {
		case <-time.After(time.Until(d.GetLeaseDeadline().AsTime()) + 500*time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		close(done)
		return nil
	}, done)
	waitSettled(t, c, queue, res.GetJobId())
	if len(attempts) != 1 {
		t.Errorf("attempts = %v, want one delivery", attempts)
	}
	if e := errs.get(); len(e) != 0 {
		t.Errorf("OnError: %v", e)
	}
}

func TestInvalidQueueIsRefused(t *testing.T) {
	c := dial(t)
	if _, err := c.Enqueue(context.Background(), "bad{name}", []byte("x")); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Enqueue: %v, want InvalidArgument", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := c.Consume(ctx, delayq.ConsumeOptions{Queues: []string{"bad{name}"}}, func(context.Context, *delayqv1.Delivery) error { return nil })
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("Consume: %v, want InvalidArgument", err)
	}
}

func TestReleaseGivesBackWithoutCountingAndShutdownSettlesAfterClose(t *testing.T) {
	c := dial(t)
	queue := queueName(t)
	res, err := c.Enqueue(context.Background(), queue, []byte("x"), delayq.WithMaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	// Release (what Consume uses for deliveries it did not start): uncounted,
	// after closing a stream that has a grace.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	graced, err := c.Service().Consume(ctx2, &delayqv1.ConsumeRequest{
		Queues: []string{queue}, MaxOutstanding: 1, ReleaseGrace: durationpb.New(5 * time.Second),
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := graced.Recv()
	if err != nil {
		t.Fatal(err)
	}
	cancel2()
	token := got.GetDeliveries()[0].GetLeaseToken()
	rel, err := c.Service().Release(context.Background(), &delayqv1.ReleaseRequest{LeaseTokens: []string{token, token}})
	if err != nil {
		t.Fatal(err)
	}
	want := []delayqv1.ReleaseResult{delayqv1.ReleaseResult_RELEASE_RESULT_RELEASED, delayqv1.ReleaseResult_RELEASE_RESULT_STALE}
	if len(rel.GetResults()) != 2 || rel.GetResults()[0] != want[0] || rel.GetResults()[1] != want[1] {
		t.Fatalf("release results = %v, want %v", rel.GetResults(), want)
	}
	job, err := c.Service().Query(context.Background(), &delayqv1.QueryRequest{Queue: queue, JobId: res.GetJobId()})
	if err != nil {
		t.Fatal(err)
	}
	if s, a := job.GetJob().GetState(), job.GetJob().GetAttempts(); s != delayqv1.JobState_JOB_STATE_READY || a != 0 {
		t.Fatalf("after release: state %v attempts %d, want READY 0", s, a)
	}

	// Consume's shutdown with its default grace: the stream closes first and the
	// running handler still acks over a unary call; the job is not redelivered.
	started := make(chan struct{})
	finish := make(chan struct{})
	var errs errorLog
	runCtx, stop := context.WithCancel(context.Background())
	result := make(chan error, 1)
	go func() {
		result <- c.Consume(runCtx, delayq.ConsumeOptions{Queues: []string{queue}, OnError: errs.add}, func(context.Context, *delayqv1.Delivery) error {
			close(started)
			<-finish
			return nil
		})
	}()
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("no delivery within 20s")
	}
	stop()
	close(finish)
	if err := <-result; err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c, queue, res.GetJobId())
	if e := errs.get(); len(e) != 0 {
		t.Errorf("OnError: %v", e)
	}
}
