package delayq

// The batcher's batches as messages on one long-lived EnqueueStream (issue
// 12; docs/decisions.md, "EnqueueStream"). A message on an open stream costs
// the server about half of a unary call, whatever the client's language. The
// stream opens on the first batch, stays open, and opens again after it
// fails; each batch waits for the answer with its batch_id. A server without
// the method (UNIMPLEMENTED) turns the batcher back to Enqueue and
// EnqueueBatch calls.
//
// grpc-go reports a send on a stream that the server refused or ended as
// io.EOF and gives the real status to the reader, so unlike grpc.aio
// (grpc#36066) the first batch need not wait for the server's accept header.

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/delayq/delayq/clients/go/delayqv1"
)

// errStreamUnsupported: the server answered UNIMPLEMENTED; no batch was stored.
var errStreamUnsupported = errors.New("delayq: the server has no EnqueueStream")

// openStream is one EnqueueStream call and the batches waiting for answers.
type openStream struct {
	stream delayqv1.DelayQueueService_EnqueueStreamClient
	cancel context.CancelFunc
	sendMu sync.Mutex // grpc-go allows one SendMsg at a time per stream

	mu      sync.Mutex
	waiting map[uint64]chan *delayqv1.EnqueueStreamResponse
	err     error         // why the stream ended, once done is closed
	done    chan struct{} // closed by the reader when the stream ends
}

type enqueueStream struct {
	rpc         delayqv1.DelayQueueServiceClient
	ids         atomic.Uint64
	unsupported atomic.Bool

	mu     sync.Mutex
	cur    *openStream
	reader sync.WaitGroup
}

// send stores one batch and returns its answer. The error is the stream's
// (a status error; errStreamUnsupported for UNIMPLEMENTED) or ctx's.
func (s *enqueueStream) send(ctx context.Context, reqs []*delayqv1.EnqueueRequest) (*delayqv1.EnqueueStreamResponse, error) {
	st, err := s.open()
	if err != nil {
		return nil, err
	}
	id := s.ids.Add(1)
	answer := make(chan *delayqv1.EnqueueStreamResponse, 1)
	st.mu.Lock()
	if st.waiting == nil { // ended already: its reader has failed the rest
		st.mu.Unlock()
		<-st.done
		return nil, st.err
	}
	st.waiting[id] = answer
	st.mu.Unlock()
	defer func() {
		st.mu.Lock()
		delete(st.waiting, id)
		st.mu.Unlock()
	}()
	st.sendMu.Lock()
	err = st.stream.Send(&delayqv1.EnqueueStreamRequest{BatchId: id, Requests: reqs})
	st.sendMu.Unlock()
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err // io.EOF: the reader gets the stream's status below
	}
	select {
	case a := <-answer:
		return a, nil
	case <-st.done:
		select { // answered just before the stream ended
		case a := <-answer:
			return a, nil
		default:
			return nil, st.err
		}
	case <-ctx.Done():
		// The batch may still be stored, as after a unary call's deadline.
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

func (s *enqueueStream) open() (*openStream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A sender that saw `unsupported` still false can get here after the
	// refusal (the batcher sends several batches at once): never reopen.
	if s.unsupported.Load() {
		return nil, errStreamUnsupported
	}
	if st := s.cur; st != nil {
		select {
		case <-st.done: // ended: open a new one
		default:
			return st, nil
		}
	}
	// No deadline: the stream lives as long as the client; each batch has its own.
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := s.rpc.EnqueueStream(ctx)
	if err != nil {
		cancel()
		if status.Code(err) == codes.Unimplemented {
			s.unsupported.Store(true)
			return nil, errStreamUnsupported
		}
		return nil, err
	}
	st := &openStream{
		stream: stream, cancel: cancel, done: make(chan struct{}),
		waiting: map[uint64]chan *delayqv1.EnqueueStreamResponse{},
	}
	s.cur = st
	s.reader.Add(1)
	go s.read(st)
	return st, nil
}

// read answers batches by id until the stream ends, then fails the rest.
func (s *enqueueStream) read(st *openStream) {
	defer s.reader.Done()
	var err error
	for {
		resp, rerr := st.stream.Recv()
		if rerr != nil {
			err = rerr
			break
		}
		st.mu.Lock()
		if ch, ok := st.waiting[resp.GetBatchId()]; ok {
			ch <- resp // buffered: one answer per id
		}
		st.mu.Unlock()
	}
	switch {
	case errors.Is(err, io.EOF):
		err = status.Error(codes.Unavailable, "delayq: the server ended the EnqueueStream")
	case status.Code(err) == codes.Unimplemented:
		s.unsupported.Store(true)
		err = errStreamUnsupported
	}
	st.mu.Lock()
	st.err = err
	st.waiting = nil
	st.mu.Unlock()
	close(st.done)
	st.cancel()
}

// close half-closes the stream once the batcher has no batch in flight; the
// server then ends it and the reader returns.
func (s *enqueueStream) close() {
	s.mu.Lock()
	st := s.cur
	s.cur = nil
	s.mu.Unlock()
	if st != nil {
		st.sendMu.Lock()
		_ = st.stream.CloseSend()
		st.sendMu.Unlock()
	}
	ended := make(chan struct{})
	go func() { s.reader.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(closeWait):
		if st != nil {
			st.cancel() // a server that does not answer: stop waiting for it
		}
		<-ended
	}
}

// closeWait bounds how long Close waits for the server to end the stream.
const closeWait = 5 * time.Second
