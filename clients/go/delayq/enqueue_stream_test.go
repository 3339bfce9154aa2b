package delayq

// The EnqueueStream transport against an in-process gRPC server whose
// EnqueueStream is scripted: answers by id, whole-batch refusals, and a
// stream that ends under a batch.

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/delayq/delayq/clients/go/delayqv1"
)

// scriptedStream answers each batch with one job id per request (its
// payload), refuses batches whose first queue is "refuse", holds batches of
// queue "late" until the next batch came (so answers go out of order), and
// ends the stream UNAVAILABLE at a batch of queue "cut".
type scriptedStream struct {
	delayqv1.UnimplementedDelayQueueServiceServer
	opened atomic.Int64
	held   chan struct{} // told when a "late" batch is held
}

func (s *scriptedStream) EnqueueStream(stream delayqv1.DelayQueueService_EnqueueStreamServer) error {
	s.opened.Add(1)
	var late *delayqv1.EnqueueStreamRequest
	for {
		req, err := stream.Recv()
		if err != nil {
			return nil // the client half-closed
		}
		switch req.GetRequests()[0].GetQueue() {
		case "cut":
			return status.Error(codes.Unavailable, "server going away")
		case "late":
			late = req
			s.held <- struct{}{}
			continue
		case "refuse":
			if err := stream.Send(&delayqv1.EnqueueStreamResponse{BatchId: req.GetBatchId(),
				Error: &delayqv1.BatchError{Code: int32(codes.PermissionDenied), Message: "namespace: not yours"}}); err != nil {
				return err
			}
			continue
		}
		for _, r := range []*delayqv1.EnqueueStreamRequest{req, late} {
			if r == nil {
				continue
			}
			resp := &delayqv1.EnqueueStreamResponse{BatchId: r.GetBatchId()}
			for _, j := range r.GetRequests() {
				resp.Results = append(resp.Results, &delayqv1.EnqueueBatchResult{
					Response: &delayqv1.EnqueueResponse{JobId: string(j.GetPayload())}})
			}
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
		late = nil
	}
}

func startScripted(t *testing.T) (*scriptedStream, delayqv1.DelayQueueServiceClient) {
	t.Helper()
	fake := &scriptedStream{held: make(chan struct{}, 1)}
	return fake, serveFake(t, fake)
}

// serveFake serves `impl` in process (with the server options) and dials it.
func serveFake(t *testing.T, impl delayqv1.DelayQueueServiceServer, opts ...grpc.ServerOption) delayqv1.DelayQueueServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	delayqv1.RegisterDelayQueueServiceServer(srv, impl)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return delayqv1.NewDelayQueueServiceClient(cc)
}

func job(queue, id string) *delayqv1.EnqueueRequest {
	return &delayqv1.EnqueueRequest{Queue: queue, Payload: []byte(id)}
}

func TestStreamAnswersEachBatchByIDInAnyOrder(t *testing.T) {
	fake, rpc := startScripted(t)
	s := &enqueueStream{rpc: rpc}
	ctx := context.Background()
	var wg sync.WaitGroup
	var lateResp *delayqv1.EnqueueStreamResponse
	var lateErr error
	wg.Add(1)
	go func() { // answered only after the next batch: out of order
		defer wg.Done()
		lateResp, lateErr = s.send(ctx, []*delayqv1.EnqueueRequest{job("late", "a"), job("late", "b")})
	}()
	<-fake.held // the server holds the late batch
	resp, err := s.send(ctx, []*delayqv1.EnqueueRequest{job("q", "c")})
	wg.Wait()
	if err != nil || lateErr != nil {
		t.Fatalf("errors: %v, %v", err, lateErr)
	}
	if got := resp.GetResults()[0].GetResponse().GetJobId(); got != "c" {
		t.Fatalf("second batch answered %q", got)
	}
	if a, b := lateResp.GetResults()[0].GetResponse().GetJobId(), lateResp.GetResults()[1].GetResponse().GetJobId(); a != "a" || b != "b" {
		t.Fatalf("late batch answered %q, %q", a, b)
	}
	s.close()
	if fake.opened.Load() != 1 {
		t.Fatalf("%d streams opened, want 1", fake.opened.Load())
	}
}

func TestWholeBatchRefusalReachesEveryCallerAndTheStreamGoesOn(t *testing.T) {
	fake, rpc := startScripted(t)
	b := newBatcher(rpc, BatchSettings{})
	items := []*batchItem{{req: job("refuse", "a")}, {req: job("refuse", "b")}}
	for _, o := range b.send(context.Background(), items) {
		if status.Code(o.err) != codes.PermissionDenied || status.Convert(o.err).Message() != "namespace: not yours" {
			t.Fatalf("want the batch's PERMISSION_DENIED, got %v", o.err)
		}
	}
	outs := b.send(context.Background(), []*batchItem{{req: job("q", "c")}})
	if outs[0].err != nil || outs[0].resp.GetJobId() != "c" {
		t.Fatalf("next batch: %v %v", outs[0].resp, outs[0].err)
	}
	b.close()
	if fake.opened.Load() != 1 {
		t.Fatalf("%d streams opened, want 1", fake.opened.Load())
	}
}

func TestAStreamEndedUnderABatchFailsItAndTheNextBatchOpensAnother(t *testing.T) {
	fake, rpc := startScripted(t)
	b := newBatcher(rpc, BatchSettings{})
	outs := b.send(context.Background(), []*batchItem{{req: job("cut", "a")}})
	if status.Code(outs[0].err) != codes.Unavailable {
		t.Fatalf("want UNAVAILABLE for the cut batch, got %v", outs[0].err)
	}
	outs = b.send(context.Background(), []*batchItem{{req: job("q", "b")}})
	if outs[0].err != nil || outs[0].resp.GetJobId() != "b" {
		t.Fatalf("next batch: %v %v", outs[0].resp, outs[0].err)
	}
	b.close()
	if fake.opened.Load() != 2 {
		t.Fatalf("%d streams opened, want 2", fake.opened.Load())
	}
}

// TestAStreamTheServerDoesNotServeIsNeverOpenedAgain: a sender that checked
// `unsupported` just before the reader set it reaches send after the refusal
// (the batcher sends several batches at once); it must get the refusal again,
// not open a second stream (the Python client did, CI at 6b4f773).
func TestAStreamTheServerDoesNotServeIsNeverOpenedAgain(t *testing.T) {
	var opened atomic.Int64
	count := grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream,
		_ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		opened.Add(1)
		return handler(srv, ss)
	})
	s := &enqueueStream{rpc: serveFake(t, &delayqv1.UnimplementedDelayQueueServiceServer{}, count)}
	for i := range 3 {
		if _, err := s.send(context.Background(), []*delayqv1.EnqueueRequest{job("q", "a")}); !errors.Is(err, errStreamUnsupported) {
			t.Fatalf("send %d: %v, want errStreamUnsupported", i, err)
		}
	}
	s.close()
	if !s.unsupported.Load() {
		t.Fatal("unsupported not set")
	}
	if n := opened.Load(); n != 1 {
		t.Fatalf("%d streams opened, want 1", n)
	}
}
