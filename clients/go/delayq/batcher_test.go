package delayq

// Unit tests of the enqueue batcher against a fake of the generated client:
// they pin down which calls it makes and who gets which answer.

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/delayq/delayq/clients/go/delayqv1"
)

// fakeRPC answers Enqueue/EnqueueBatch; a batch whose first job has queue
// "hold" waits for release; jobs of queue "bad" are refused per item.
type fakeRPC struct {
	delayqv1.DelayQueueServiceClient
	mu      sync.Mutex
	calls   []int // jobs per call, in call order
	started chan struct{}
	release chan struct{}
	failRPC error
}

func (f *fakeRPC) record(n int, queue string) {
	f.mu.Lock()
	f.calls = append(f.calls, n)
	f.mu.Unlock()
	if f.started != nil {
		f.started <- struct{}{}
	}
	if queue == "hold" {
		<-f.release
	}
}

func (f *fakeRPC) Enqueue(_ context.Context, req *delayqv1.EnqueueRequest, _ ...grpc.CallOption) (*delayqv1.EnqueueResponse, error) {
	f.record(1, req.GetQueue())
	if f.failRPC != nil {
		return nil, f.failRPC
	}
	return &delayqv1.EnqueueResponse{JobId: string(req.GetPayload())}, nil
}

func (f *fakeRPC) EnqueueBatch(_ context.Context, req *delayqv1.EnqueueBatchRequest, _ ...grpc.CallOption) (*delayqv1.EnqueueBatchResponse, error) {
	f.record(len(req.GetRequests()), req.GetRequests()[0].GetQueue())
	if f.failRPC != nil {
		return nil, f.failRPC
	}
	resp := &delayqv1.EnqueueBatchResponse{}
	for _, r := range req.GetRequests() {
		if r.GetQueue() == "bad" {
			resp.Results = append(resp.Results, &delayqv1.EnqueueBatchResult{
				Error: &delayqv1.BatchError{Code: int32(codes.InvalidArgument), Message: "queue: bad name"}})
			continue
		}
		resp.Results = append(resp.Results, &delayqv1.EnqueueBatchResult{
			Response: &delayqv1.EnqueueResponse{JobId: string(r.GetPayload())}})
	}
	return resp, nil
}

// EnqueueStream: the fake is a server from before the stream, so the batcher
// falls back to the calls these tests count.
func (f *fakeRPC) EnqueueStream(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[delayqv1.EnqueueStreamRequest, delayqv1.EnqueueStreamResponse], error) {
	return nil, status.Error(codes.Unimplemented, "unknown method EnqueueStream")
}

func (f *fakeRPC) jobsPerCall() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.calls...)
}

type answer struct {
	id  string
	err error
}

// holdThenGather sends one held job, then n more behind it, and returns
// their answer channels once all n wait in the batcher.
func holdThenGather(t *testing.T, c *Client, f *fakeRPC, queues []string) (chan answer, []chan answer) {
	t.Helper()
	first := make(chan answer, 1)
	go func() {
		r, err := c.Enqueue(context.Background(), "hold", []byte("first"))
		first <- answer{r.GetJobId(), err}
	}()
	<-f.started
	rest := make([]chan answer, len(queues))
	for i, q := range queues {
		rest[i] = make(chan answer, 1)
		go func(i int, q string) {
			r, err := c.Enqueue(context.Background(), q, []byte{byte('a' + i)})
			rest[i] <- answer{r.GetJobId(), err}
		}(i, q)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.batch.mu.Lock()
		n := len(c.batch.pending)
		c.batch.mu.Unlock()
		if n == len(queues) {
			return first, rest
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d calls gathered", n, len(queues))
		}
		time.Sleep(time.Millisecond)
	}
}

func TestGatheredCallsTravelTogetherAndGetTheirOwnAnswers(t *testing.T) {
	f := &fakeRPC{started: make(chan struct{}, 10), release: make(chan struct{})}
	c := (&Client{rpc: f}).WithBatching(BatchSettings{MaxDelay: time.Minute})
	first, rest := holdThenGather(t, c, f, []string{"q", "bad", "q"})
	close(f.release)
	if a := <-first; a.err != nil || a.id != "first" {
		t.Fatalf("first: %+v", a)
	}
	got := []answer{<-rest[0], <-rest[1], <-rest[2]}
	if got[0].id != "a" || got[2].id != "c" || got[0].err != nil || got[2].err != nil {
		t.Fatalf("stored jobs answered %+v", got)
	}
	if status.Code(got[1].err) != codes.InvalidArgument || got[1].id != "" {
		t.Fatalf("refused job answered %+v", got[1])
	}
	// The lone first call went alone; the other three gathered into one call
	// as soon as it returned (group commit), long before MaxDelay.
	if calls := f.jobsPerCall(); len(calls) != 2 || calls[0] != 1 || calls[1] != 3 {
		t.Fatalf("jobs per call = %v, want [1 3]", calls)
	}
	_ = c.Close()
}

func TestCloseSendsWhatIsGathering(t *testing.T) {
	f := &fakeRPC{started: make(chan struct{}, 10), release: make(chan struct{})}
	c := (&Client{rpc: f}).WithBatching(BatchSettings{MaxDelay: time.Minute})
	_, rest := holdThenGather(t, c, f, []string{"q", "q"})
	closed := make(chan struct{})
	go func() { _ = c.Close(); close(closed) }()
	<-f.started // Close sent the gathered jobs without waiting for MaxDelay
	close(f.release)
	<-closed
	for i, ch := range rest {
		if a := <-ch; a.err != nil {
			t.Fatalf("job %d: %v", i, a.err)
		}
	}
	if _, err := c.Enqueue(context.Background(), "q", nil); err != ErrClientClosed {
		t.Fatalf("Enqueue after Close: %v", err)
	}
}

func TestAFailedBatchCallFailsEveryCaller(t *testing.T) {
	f := &fakeRPC{failRPC: status.Error(codes.Unavailable, "down")}
	c := (&Client{rpc: f}).WithBatching(BatchSettings{})
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_, errs[i] = c.Enqueue(context.Background(), "q", []byte{byte(i)})
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("caller %d: %v", i, err)
		}
	}
	_ = c.Close()
}
