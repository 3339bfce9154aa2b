package delayq

// Unit tests of the worker loop against an in-process fake of the service
// (bufconn): they pin down what the loop sends (ack, nack, renewals, drain
// order) deterministically. Behaviour against the real server is covered by
// integration_test.go.

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/delayq/delayq/clients/go/delayqv1"
)

// fakeServer records what the worker sends; each event is also pushed on
// events so tests can wait for it.
type fakeServer struct {
	delayqv1.UnimplementedDelayQueueServiceServer
	send      chan *delayqv1.Delivery // deliveries to stream
	events    chan string             // "ack:<tok>", "nack:<tok>", "extend:<tok>", "stream-closed"
	mu        sync.Mutex
	acks      []string
	ackCalls  [][]string                          // tokens of each Ack call, in arrival order
	ackResult func(tok string) delayqv1.AckResult // nil: every token ACKED
	ackGate   chan struct{}                       // not nil: Ack calls wait until it is closed
	nacks     []*delayqv1.NackRequest
	extendErr error
	consumes  []*delayqv1.ConsumeRequest
}

func (f *fakeServer) Consume(req *delayqv1.ConsumeRequest, stream delayqv1.DelayQueueService_ConsumeServer) error {
	f.mu.Lock()
	f.consumes = append(f.consumes, req)
	f.mu.Unlock()
	defer func() { f.events <- "stream-closed" }()
	for {
		select {
		case d := <-f.send:
			if err := stream.Send(&delayqv1.ConsumeResponse{Deliveries: []*delayqv1.Delivery{d}}); err != nil {
				return err
			}
		case <-stream.Context().Done():
			return nil
		}
	}
}

func (f *fakeServer) Ack(_ context.Context, req *delayqv1.AckRequest) (*delayqv1.AckResponse, error) {
	f.mu.Lock()
	f.acks = append(f.acks, req.GetLeaseTokens()...)
	f.ackCalls = append(f.ackCalls, req.GetLeaseTokens())
	result, gate := f.ackResult, f.ackGate
	f.mu.Unlock()
	if gate != nil {
		<-gate
	}
	res := make([]delayqv1.AckResult, len(req.GetLeaseTokens()))
	for i, tok := range req.GetLeaseTokens() {
		res[i] = delayqv1.AckResult_ACK_RESULT_ACKED
		if result != nil {
			res[i] = result(tok)
		}
		f.events <- "ack:" + tok
	}
	return &delayqv1.AckResponse{Results: res}, nil
}

func (f *fakeServer) Release(_ context.Context, req *delayqv1.ReleaseRequest) (*delayqv1.ReleaseResponse, error) {
	res := make([]delayqv1.ReleaseResult, len(req.GetLeaseTokens()))
	for i, tok := range req.GetLeaseTokens() {
		res[i] = delayqv1.ReleaseResult_RELEASE_RESULT_RELEASED
		f.events <- "release:" + tok
	}
	return &delayqv1.ReleaseResponse{Results: res}, nil
}

func (f *fakeServer) Nack(_ context.Context, req *delayqv1.NackRequest) (*delayqv1.NackResponse, error) {
	f.mu.Lock()
	f.nacks = append(f.nacks, req)
	f.mu.Unlock()
	f.events <- "nack:" + req.GetLeaseToken()
	return &delayqv1.NackResponse{State: delayqv1.JobState_JOB_STATE_SCHEDULED}, nil
}

func (f *fakeServer) ExtendLease(_ context.Context, req *delayqv1.ExtendLeaseRequest) (*delayqv1.ExtendLeaseResponse, error) {
	f.mu.Lock()
	err := f.extendErr
	f.mu.Unlock()
	f.events <- "extend:" + req.GetLeaseToken()
	if err != nil {
		return nil, err
	}
	return &delayqv1.ExtendLeaseResponse{LeaseDeadline: timestamppb.Now()}, nil
}

func startFake(t *testing.T) (*fakeServer, *Client) {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	f := &fakeServer{send: make(chan *delayqv1.Delivery), events: make(chan string, 4096)}
	delayqv1.RegisterDelayQueueServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	c, err := Dial("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return f, c
}

// runConsume starts Consume in the background; the returned stop cancels it
// and waits for it to return.
func runConsume(t *testing.T, c *Client, opts ConsumeOptions, h Handler) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Consume(ctx, opts, h) }()
	t.Cleanup(cancel)
	return func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(5 * time.Second):
			t.Fatal("Consume did not return within 5s of cancel")
			return nil
		}
	}
}

func delivery(tok string) *delayqv1.Delivery {
	return &delayqv1.Delivery{LeaseToken: tok, Attempt: 1, Job: &delayqv1.Job{Id: "job-" + tok}}
}

// waitEvent waits (with a deadline) for want, skipping other events.
func waitEvent(t *testing.T, f *fakeServer, want string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case ev := <-f.events:
			if ev == want {
				return
			}
		case <-deadline:
			t.Fatalf("no %q event within 5s", want)
		}
	}
}

func TestConsumeAcksOnSuccessAndNacksOnError(t *testing.T) {
	f, c := startFake(t)
	stop := runConsume(t, c, ConsumeOptions{Queues: []string{"q"}, Concurrency: 2}, func(_ context.Context, d *delayqv1.Delivery) error {
		switch d.GetLeaseToken() {
		case "ok":
			return nil
		case "retry":
			return RetryAfter(errors.New("busy"), 3*time.Second)
		case "dead":
			return DeadLetter(errors.New("malformed payload"))
		case "panic":
			panic("boom")
		default:
			return errors.New("plain failure")
		}
	})
	for _, tok := range []string{"ok", "retry", "dead", "panic", "plain"} {
		f.send <- delivery(tok)
		if tok == "ok" {
			waitEvent(t, f, "ack:ok")
		} else {
			waitEvent(t, f, "nack:"+tok)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.acks) != 1 || f.acks[0] != "ok" {
		t.Errorf("acks = %v, want [ok]", f.acks)
	}
	byTok := map[string]*delayqv1.NackRequest{}
	for _, n := range f.nacks {
		byTok[n.GetLeaseToken()] = n
	}
	if n := byTok["retry"]; n.GetDelay().AsDuration() != 3*time.Second || n.GetDeadLetter() || n.GetReason() != "busy" {
		t.Errorf("retry nack = %v", n)
	}
	if n := byTok["dead"]; !n.GetDeadLetter() || n.GetDelay() != nil || n.GetReason() != "malformed payload" {
		t.Errorf("dead nack = %v", n)
	}
	if n := byTok["panic"]; !strings.Contains(n.GetReason(), "panicked: boom") {
		t.Errorf("panic nack = %v", n)
	}
	if n := byTok["plain"]; n.GetDelay() != nil || n.GetDeadLetter() || n.GetReason() != "plain failure" {
		t.Errorf("plain nack = %v", n)
	}
	req := f.consumes[0]
	if req.GetMaxOutstanding() != 2 || req.GetLeaseDuration().AsDuration() != 30*time.Second || req.GetQueues()[0] != "q" {
		t.Errorf("consume request = %v", req)
	}
}

func TestConsumeRenewsLeaseWhileHandlerRuns(t *testing.T) {
	f, c := startFake(t)
	release := make(chan struct{})
	stop := runConsume(t, c, ConsumeOptions{Queues: []string{"q"}, LeaseDuration: 3 * time.Second, RenewEvery: 10 * time.Millisecond},
		func(ctx context.Context, _ *delayqv1.Delivery) error {
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	f.send <- delivery("slow")
	waitEvent(t, f, "extend:slow")
	waitEvent(t, f, "extend:slow")
	close(release)
	waitEvent(t, f, "ack:slow")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestConsumeLostLeaseCancelsHandlerAndSkipsAck(t *testing.T) {
	f, c := startFake(t)
	f.extendErr = status.Error(codes.FailedPrecondition, "stale lease token")
	handlerSawCancel := make(chan struct{})
	var mu sync.Mutex
	var reported []error
	stop := runConsume(t, c, ConsumeOptions{
		Queues: []string{"q"}, LeaseDuration: 3 * time.Second, RenewEvery: 10 * time.Millisecond,
		OnError: func(_ *delayqv1.Delivery, err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() },
	}, func(ctx context.Context, _ *delayqv1.Delivery) error {
		<-ctx.Done()
		close(handlerSawCancel)
		return ctx.Err()
	})
	f.send <- delivery("stale")
	select {
	case <-handlerSawCancel:
	case <-time.After(5 * time.Second):
		t.Fatal("handler context not cancelled after the lease was lost")
	}
	f.send <- delivery("next") // the loop goes on; the stale one was never settled
	waitEvent(t, f, "extend:next")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, tok := range f.acks {
		if tok == "stale" {
			t.Error("a delivery whose lease was lost was acked")
		}
	}
	for _, n := range f.nacks {
		if n.GetLeaseToken() == "stale" {
			t.Error("a delivery whose lease was lost was nacked")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reported) == 0 || !errors.Is(reported[0], ErrLeaseLost) {
		t.Errorf("OnError got %v, want ErrLeaseLost first", reported)
	}
}

// nextEvents collects the next n events, failing after 5s.
func nextEvents(t *testing.T, f *fakeServer, n int) []string {
	t.Helper()
	deadline := time.After(5 * time.Second)
	var got []string
	for len(got) < n {
		select {
		case ev := <-f.events:
			got = append(got, ev)
		case <-deadline:
			t.Fatalf("events so far %v, want %d", got, n)
		}
	}
	return got
}

func TestShutdownWithoutGraceSettlesRunningHandlerBeforeClosingStream(t *testing.T) {
	f, c := startFake(t)
	started := make(chan struct{})
	release := make(chan struct{})
	stop := runConsume(t, c, ConsumeOptions{Queues: []string{"q"}, ReleaseGrace: -1}, func(ctx context.Context, _ *delayqv1.Delivery) error {
		close(started)
		<-release
		return ctx.Err() // nil: shutdown does not cancel a handler within the drain timeout
	})
	f.send <- delivery("inflight")
	<-started
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	close(release)
	// Without a grace the ack must reach the server while the stream is still open.
	if order := nextEvents(t, f, 2); order[0] != "ack:inflight" || order[1] != "stream-closed" {
		t.Errorf("events = %v, want ack before stream close", order)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if got := f.consumes[0].GetReleaseGrace(); got != nil {
		t.Errorf("release_grace = %v, want unset", got)
	}
}

func TestShutdownGivesBackUnstartedAndKeepsRunningLeases(t *testing.T) {
	f, c := startFake(t)
	held := make(chan string, 4)
	testHookHeld = func(d *delayqv1.Delivery) { held <- d.GetLeaseToken() }
	t.Cleanup(func() { testHookHeld = func(*delayqv1.Delivery) {} })
	started := make(chan struct{})
	release := make(chan struct{})
	stop := runConsume(t, c, ConsumeOptions{Queues: []string{"q"}}, func(ctx context.Context, d *delayqv1.Delivery) error {
		close(started)
		<-release
		return ctx.Err()
	})
	f.send <- delivery("running")
	<-started
	f.send <- delivery("waiting") // concurrency 1: held for a slot, never started
	for tok := range held {
		if tok == "waiting" {
			break
		}
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// The stream closes first (the grace keeps its leases), the running lease is
	// extended at once, the unstarted one is given back uncounted.
	got := nextEvents(t, f, 3)
	want := map[string]bool{"stream-closed": true, "extend:running": true, "release:waiting": true}
	for _, ev := range got {
		if !want[ev] {
			t.Fatalf("events = %v, want %v", got, want)
		}
	}
	close(release)
	waitEvent(t, f, "ack:running") // settled over a unary call after the close
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if g := f.consumes[0].GetReleaseGrace().AsDuration(); g != 5*time.Second {
		t.Errorf("release_grace = %v, want 5s", g)
	}
}

func TestConsumeRefusesEmptyQueues(t *testing.T) {
	if err := New(nil).Consume(context.Background(), ConsumeOptions{}, nil); err == nil {
		t.Error("Consume with no queues returned nil")
	}
}

func TestEnqueueRequestOptions(t *testing.T) {
	c := New(nil).WithNamespace("ns")
	due := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	r := c.EnqueueRequest("emails", []byte("x"),
		WithHeaders(map[string]string{"traceparent": "00-a-b-01", "k": "1"}),
		WithHeaders(map[string]string{"k": "2"}),
		WithDueTime(due), WithTTL(time.Hour), WithMaxAttempts(5), WithIdempotencyKey("idem"))
	if r.GetNamespace() != "ns" || r.GetQueue() != "emails" || string(r.GetPayload()) != "x" {
		t.Errorf("request = %v", r)
	}
	if r.GetHeaders()["traceparent"] != "00-a-b-01" || r.GetHeaders()["k"] != "2" {
		t.Errorf("headers = %v", r.GetHeaders())
	}
	if !r.GetDueTime().AsTime().Equal(due) || r.GetDelay() != nil {
		t.Errorf("schedule = %v", r.GetSchedule())
	}
	if r.GetTtl().AsDuration() != time.Hour || r.GetMaxAttempts() != 5 || r.GetIdempotencyKey() != "idem" {
		t.Errorf("request = %v", r)
	}
	if d := c.EnqueueRequest("q", nil, WithDueTime(due), WithDelay(time.Second)).GetDelay().AsDuration(); d != time.Second {
		t.Errorf("last schedule option should win, delay = %v", d)
	}
}

func TestNackReasonTruncatedOnRuneBoundary(t *testing.T) {
	long := strings.Repeat("é", maxReasonBytes) // 2 bytes per rune
	got := nackRequest("t", errors.New(long)).GetReason()
	if len(got) > maxReasonBytes || !strings.HasPrefix(long, got) || len(got) != maxReasonBytes {
		t.Errorf("reason cut to %d bytes", len(got))
	}
}
