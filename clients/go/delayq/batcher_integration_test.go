//go:build integration

package delayq_test

import (
	"context"
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

// TestConcurrentEnqueuesBecomeFewCalls counts the RPCs the channel makes
// for 200 concurrent Enqueue calls, and checks each caller's answer.
func TestConcurrentEnqueuesBecomeFewCalls(t *testing.T) {
	var calls atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		calls.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c, err := delayq.Dial(os.Getenv("DELAYQ_ADDR"),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(count))
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
	if got := calls.Load(); got > n/4 {
		t.Fatalf("%d concurrent Enqueue calls made %d RPCs", n, got)
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
