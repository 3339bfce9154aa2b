package delayq

// Unit tests of ack batching (acks.go) against the in-process fake. Credit
// (max_outstanding) is enforced only by the real server, so the credit rule
// and acks landing there are covered in acks_integration_test.go.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/delayq/delayq/clients/go/delayqv1"
)

// ackCallsSnapshot returns the fake's Ack calls so far.
func ackCallsSnapshot(f *fakeServer) [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]string(nil), f.ackCalls...)
}

// waitAckCalls polls until the fake has seen n Ack calls (10s deadline).
func waitAckCalls(t *testing.T, f *fakeServer, n int) [][]string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		calls := ackCallsSnapshot(f)
		if len(calls) >= n {
			return calls
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ack calls so far %v, want %d", calls, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// releaseTogether runs n deliveries whose handlers all wait for one signal,
// then lets them finish at once.
func releaseTogether(t *testing.T, f *fakeServer, tokens []string, started chan string, release chan struct{}) {
	t.Helper()
	for _, tok := range tokens {
		f.send <- delivery(tok)
	}
	for range tokens {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("handlers did not all start within 10s")
		}
	}
	close(release)
}

func TestAcksOfDeliveriesFinishedTogetherShareOneCall(t *testing.T) {
	f, c := startFake(t)
	started := make(chan string, 20)
	release := make(chan struct{})
	// Credit to spare (40 > 20), so only the linger sends them.
	stop := runConsume(t, c, ConsumeOptions{Queues: []string{"q"}, Concurrency: 40, AckLinger: time.Second},
		func(_ context.Context, d *delayqv1.Delivery) error {
			started <- d.GetLeaseToken()
			<-release
			return nil
		})
	tokens := make([]string, 20)
	for i := range tokens {
		tokens[i] = fmt.Sprintf("t%02d", i)
	}
	releaseTogether(t, f, tokens, started, release)
	calls := waitAckCalls(t, f, 1)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if calls = ackCallsSnapshot(f); len(calls) != 1 || len(calls[0]) != 20 {
		t.Fatalf("Ack calls = %v, want one call with the 20 tokens", calls)
	}
	got := append([]string(nil), calls[0]...)
	sort.Strings(got)
	if strings.Join(got, ",") != strings.Join(tokens, ",") {
		t.Errorf("acked %v, want %v", got, tokens)
	}
}

func TestStaleAckInBatchIsReportedForThatDeliveryOnly(t *testing.T) {
	f, c := startFake(t)
	f.ackResult = func(tok string) delayqv1.AckResult {
		if tok == "stale" {
			return delayqv1.AckResult_ACK_RESULT_STALE
		}
		return delayqv1.AckResult_ACK_RESULT_ACKED
	}
	var mu sync.Mutex
	reported := map[string][]error{}
	started := make(chan string, 3)
	release := make(chan struct{})
	stop := runConsume(t, c, ConsumeOptions{
		Queues: []string{"q"}, Concurrency: 10, AckLinger: time.Second,
		OnError: func(d *delayqv1.Delivery, err error) {
			mu.Lock()
			defer mu.Unlock()
			reported[d.GetLeaseToken()] = append(reported[d.GetLeaseToken()], err)
		},
	}, func(_ context.Context, d *delayqv1.Delivery) error {
		started <- d.GetLeaseToken()
		<-release
		return nil
	})
	releaseTogether(t, f, []string{"ok1", "stale", "ok2"}, started, release)
	waitAckCalls(t, f, 1)
	if err := stop(); err != nil { // returns after the Ack calls are answered and reported
		t.Fatal(err)
	}
	if calls := ackCallsSnapshot(f); len(calls) != 1 || len(calls[0]) != 3 {
		t.Fatalf("Ack calls = %v, want one call with 3 tokens", calls)
	}
	mu.Lock()
	defer mu.Unlock()
	errs := reported["stale"]
	if len(reported) != 1 || len(errs) != 1 || !strings.Contains(errs[0].Error(), "ack not applied") {
		t.Errorf("OnError by token = %v, want one 'ack not applied' for stale", reported)
	}
}

func TestShutdownSendsAcksWithoutWaitingForSlowHandlers(t *testing.T) {
	f, c := startFake(t)
	started := make(chan string, 2)
	releaseSlow, releaseQuick := make(chan struct{}), make(chan struct{})
	stop := runConsume(t, c, ConsumeOptions{Queues: []string{"q"}, Concurrency: 10, AckLinger: time.Hour},
		func(_ context.Context, d *delayqv1.Delivery) error {
			started <- d.GetLeaseToken()
			if d.GetLeaseToken() == "slow" {
				<-releaseSlow
			} else {
				<-releaseQuick
			}
			return nil
		})
	f.send <- delivery("slow")
	f.send <- delivery("quick")
	<-started
	<-started
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	waitEvent(t, f, "stream-closed") // the shutdown has begun
	close(releaseQuick)
	// No linger while stopping: the ack goes out while "slow" still runs.
	waitEvent(t, f, "ack:quick")
	close(releaseSlow)
	waitEvent(t, f, "ack:slow")
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

// newTestAcker is an acker with spare credit whose deliveries count as finished.
func newTestAcker(c *Client, opts ConsumeOptions, onError func(*delayqv1.Delivery, error)) *acker {
	opts.Queues = []string{"q"}
	opts.OnError = onError
	return newAcker(c.rpc, opts.withDefaults(), func() int { return 1 }, nil)
}

func TestAckCallsInFlightAreCappedAndWaitingAcksShareTheNext(t *testing.T) {
	f, c := startFake(t)
	f.ackGate = make(chan struct{})
	a := newTestAcker(c, ConsumeOptions{Concurrency: 100, AckLinger: -1}, nil)
	for _, tok := range []string{"a", "b", "c", "d", "e"} {
		a.add(delivery(tok)) // a and b take both call slots; c, d, e wait
	}
	waitAckCalls(t, f, 2)
	close(f.ackGate)
	calls := waitAckCalls(t, f, 3) // sent as a call slot frees, not by close
	a.close()
	var sizes []int
	for _, call := range calls {
		sizes = append(sizes, len(call))
	}
	if len(calls) != 3 || sizes[0] != 1 || sizes[1] != 1 || strings.Join(calls[2], ",") != "c,d,e" {
		t.Errorf("Ack calls = %v, want [a] and [b] then [c d e]", calls)
	}
}

func TestFullAckCallGoesWithoutLinger(t *testing.T) {
	f, c := startFake(t)
	a := newTestAcker(c, ConsumeOptions{Concurrency: 5000, AckLinger: time.Hour}, nil)
	for i := range maxTokensPerCall + 1 {
		a.add(delivery(fmt.Sprint(i)))
	}
	// The first 1,000 go at once; the last one lingers until close.
	if calls := waitAckCalls(t, f, 1); len(calls) != 1 || len(calls[0]) != maxTokensPerCall {
		t.Fatalf("Ack call sizes: %d calls, first %d tokens; want one of %d", len(calls), len(calls[0]), maxTokensPerCall)
	}
	a.close()
	if calls := ackCallsSnapshot(f); len(calls) != 2 || len(calls[1]) != 1 {
		t.Errorf("%d Ack calls after close, want 2 (the second with the last token)", len(calls))
	}
}

func TestFailedAckCallIsReportedForEachDelivery(t *testing.T) {
	_, c := startFake(t)
	var mu sync.Mutex
	var failed []string
	a := newTestAcker(c, ConsumeOptions{Concurrency: 10, AckLinger: time.Hour}, func(d *delayqv1.Delivery, err error) {
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(err.Error(), "delayq: ack:") {
			failed = append(failed, d.GetLeaseToken())
		}
	})
	a.rpc = failingAcks{a.rpc}
	a.add(delivery("x"))
	a.add(delivery("y"))
	a.close()
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(failed, ",") != "x,y" {
		t.Errorf("failed acks reported for %v, want [x y]", failed)
	}
}

// failingAcks fails every Ack call.
type failingAcks struct {
	delayqv1.DelayQueueServiceClient
}

var errAckCall = errors.New("connection reset")

func (failingAcks) Ack(context.Context, *delayqv1.AckRequest, ...grpc.CallOption) (*delayqv1.AckResponse, error) {
	return nil, errAckCall
}

func TestAckLingerDefaults(t *testing.T) {
	for _, tc := range []struct{ set, want time.Duration }{
		{0, 10 * time.Millisecond},
		{-1, -1},
		{time.Hour, 10 * time.Second}, // capped at RenewEvery (LeaseDuration/3)
	} {
		if got := (ConsumeOptions{AckLinger: tc.set}).withDefaults().AckLinger; got != tc.want {
			t.Errorf("AckLinger %v: got %v, want %v", tc.set, got, tc.want)
		}
	}
}
