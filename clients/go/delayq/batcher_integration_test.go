//go:build integration

package delayq_test

import (
	"context"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/delayq/delayq/clients/go/delayq"
	"github.com/delayq/delayq/clients/go/delayqv1"
)

// countingStream counts the messages a client stream sends.
type countingStream struct {
	grpc.ClientStream
	sent *atomic.Int64
}

func (s countingStream) SendMsg(m any) error {
	s.sent.Add(1)
	return s.ClientStream.SendMsg(m)
}

// TestConcurrentEnqueuesBecomeFewMessages counts the RPCs and stream messages
// the channel carries for 200 concurrent Enqueue calls, and checks each
// caller's answer: the batches travel on one EnqueueStream, no unary call.
func TestConcurrentEnqueuesBecomeFewMessages(t *testing.T) {
	var calls, streams, messages atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		calls.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	countStream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		streams.Add(1)
		s, err := streamer(ctx, desc, cc, method, opts...)
		return countingStream{s, &messages}, err
	}
	c, err := delayq.Dial(os.Getenv("DELAYQ_ADDR"), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(count), grpc.WithStreamInterceptor(countStream))
	if err != nil {
		t.Fatal(err)
	}
	q := queueName(t)
	const n = 200
	ids := make([]string, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			queue := q
			if i%50 == 7 {
				queue = "bad:name"
			}
			r, err := c.Enqueue(context.Background(), queue, []byte("x"))
			ids[i], errs[i] = r.GetJobId(), err
		}(i)
	}
	close(start)
	wg.Wait()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i := range n {
		if i%50 == 7 {
			if status.Code(errs[i]) != codes.InvalidArgument {
				t.Fatalf("job %d: want INVALID_ARGUMENT, got %v", i, errs[i])
			}
			continue
		}
		if errs[i] != nil || ids[i] == "" || seen[ids[i]] {
			t.Fatalf("job %d: id %q err %v", i, ids[i], errs[i])
		}
		seen[ids[i]] = true
	}
	if calls.Load() != 0 || streams.Load() != 1 {
		t.Fatalf("%d unary calls and %d streams, want 0 and 1", calls.Load(), streams.Load())
	}
	if got := messages.Load(); got > n/4 {
		t.Fatalf("%d concurrent Enqueue calls made %d stream messages", n, got)
	}
	plain := dial(t)
	st, err := plain.Service().GetQueueStats(context.Background(), &delayqv1.GetQueueStatsRequest{Queue: q})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetStats().GetEnqueuedTotal() != n-4 {
		t.Fatalf("enqueued_total = %d, want %d", st.GetStats().GetEnqueuedTotal(), n-4)
	}
}

// unaryOnly is a server from before EnqueueStream: it forwards Enqueue and
// EnqueueBatch to the real server and knows no other method.
type unaryOnly struct {
	delayqv1.UnimplementedDelayQueueServiceServer
	to           delayqv1.DelayQueueServiceClient
	calls, batch atomic.Int64
}

func (u *unaryOnly) Enqueue(ctx context.Context, r *delayqv1.EnqueueRequest) (*delayqv1.EnqueueResponse, error) {
	u.calls.Add(1)
	return u.to.Enqueue(ctx, r)
}

func (u *unaryOnly) EnqueueBatch(ctx context.Context, r *delayqv1.EnqueueBatchRequest) (*delayqv1.EnqueueBatchResponse, error) {
	u.batch.Add(1)
	return u.to.EnqueueBatch(ctx, r)
}

// TestBatcherFallsBackToCallsWithoutEnqueueStream: against a server without
// the method every job is stored once, through Enqueue and EnqueueBatch.
func TestBatcherFallsBackToCallsWithoutEnqueueStream(t *testing.T) {
	direct := dial(t)
	proxy := &unaryOnly{to: direct.Service()}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	delayqv1.RegisterDelayQueueServiceServer(srv, proxy)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	c, err := delayq.Dial(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	q := queueName(t)
	const n = 60
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_, errs[i] = c.Enqueue(context.Background(), q, []byte("x"))
		}(i)
	}
	wg.Wait()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("job %d: %v", i, err)
		}
	}
	if proxy.calls.Load()+proxy.batch.Load() == 0 {
		t.Fatal("no call reached the unary methods")
	}
	st, err := direct.Service().GetQueueStats(context.Background(), &delayqv1.GetQueueStatsRequest{Queue: q})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetStats().GetEnqueuedTotal() != n {
		t.Fatalf("enqueued_total = %d, want %d", st.GetStats().GetEnqueuedTotal(), n)
	}
}
