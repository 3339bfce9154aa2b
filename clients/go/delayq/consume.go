package delayq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/delayq/delayq/clients/go/delayqv1"
)

// Handler processes one delivery. Returning nil acks it; returning an error
// nacks it with the error text as reason (wrap with RetryAfter or DeadLetter
// to choose where it goes). A panic counts as an error. ctx is cancelled
// when the lease is lost or the drain timeout of a shutdown runs out.
type Handler func(ctx context.Context, d *delayqv1.Delivery) error

// ConsumeOptions configure Consume. Only Queues is required.
type ConsumeOptions struct {
	// Queues in priority order (queues[0] is always preferred).
	Queues []string
	// Concurrency is how many handlers run at once; it is sent as the
	// stream's max_outstanding. Default 1.
	Concurrency int
	// LeaseDuration asked for each delivery, and the extension asked at each
	// renewal. Default 30s; the server accepts 1s to 12h.
	LeaseDuration time.Duration
	// RenewEvery is how often a running handler's lease is extended.
	// Default LeaseDuration/3, so two renewals can fail before it runs out.
	RenewEvery time.Duration
	// DrainTimeout bounds how long a shutdown waits for running handlers
	// before cancelling their contexts. Default 30s.
	DrainTimeout time.Duration
	// MaxReconnectBackoff caps the wait between attempts to reopen a broken
	// stream. Default 5s.
	MaxReconnectBackoff time.Duration
	// ReleaseGrace is how long the server keeps the stream's leases after the
	// stream ends (the request's release_grace). Within it, deliveries not
	// started are given back with Release (their attempts not counted) and
	// running handlers keep their leases and still settle, so a transport blip
	// never runs a job twice; after a real crash the jobs are redelivered
	// after the grace. Default 5s, capped at LeaseDuration; negative: none
	// (leases are released, attempts counted, the moment the stream ends).
	ReleaseGrace time.Duration
	// AckLinger is how long a finished delivery's ack waits for others to
	// share its Ack call: each call costs the server about 1 ms of CPU, so
	// one per job is most of its CPU at 1,000 jobs/s. Acks go at once when
	// the stream has no credit left (the next delivery waits for them) and
	// on shutdown. Default 10ms, capped at RenewEvery (a lingering ack's
	// lease is no longer renewed); negative: no linger (each ack goes at
	// once, or with the others waiting while two Ack calls are in flight).
	AckLinger time.Duration
	// OnError hears about problems that do not stop the loop: a failed ack,
	// nack or renewal, a stale ack result, a lost lease (ErrLeaseLost), a
	// broken stream about to be reopened (d is nil then). Default: ignored.
	OnError func(d *delayqv1.Delivery, err error)
}

func (o ConsumeOptions) withDefaults() ConsumeOptions {
	if o.Concurrency <= 0 {
		o.Concurrency = 1
	}
	if o.LeaseDuration <= 0 {
		o.LeaseDuration = 30 * time.Second
	}
	if o.RenewEvery <= 0 {
		o.RenewEvery = o.LeaseDuration / 3
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = 30 * time.Second
	}
	if o.MaxReconnectBackoff <= 0 {
		o.MaxReconnectBackoff = 5 * time.Second
	}
	if o.ReleaseGrace == 0 {
		o.ReleaseGrace = 5 * time.Second
	}
	o.ReleaseGrace = max(0, min(o.ReleaseGrace, o.LeaseDuration))
	if o.AckLinger == 0 {
		o.AckLinger = 10 * time.Millisecond
	}
	o.AckLinger = min(o.AckLinger, o.RenewEvery)
	if o.OnError == nil {
		o.OnError = func(*delayqv1.Delivery, error) {}
	}
	return o
}

// settleTimeout bounds one Ack, Nack or ExtendLease call.
const settleTimeout = 10 * time.Second

// Consume runs h for every delivery of opts.Queues until ctx is cancelled,
// reopening the stream with backoff when it breaks. On cancellation it stops
// taking deliveries, lets running handlers finish (up to DrainTimeout) and
// settles them before closing the stream, then returns nil. It returns an
// error at once for refusals that a retry cannot fix (INVALID_ARGUMENT,
// UNAUTHENTICATED, PERMISSION_DENIED, UNIMPLEMENTED).
func (c *Client) Consume(ctx context.Context, opts ConsumeOptions, h Handler) error {
	if len(opts.Queues) == 0 {
		return errors.New("delayq: ConsumeOptions.Queues is empty")
	}
	opts = opts.withDefaults()
	backoff := 50 * time.Millisecond
	for {
		started := time.Now()
		err := c.consumeStream(ctx, opts, h)
		if ctx.Err() != nil {
			return nil
		}
		switch status.Code(err) {
		case codes.InvalidArgument, codes.Unauthenticated, codes.PermissionDenied, codes.Unimplemented:
			return err
		}
		opts.OnError(nil, fmt.Errorf("delayq: consume stream broke, reopening: %w", err))
		if time.Since(started) > opts.MaxReconnectBackoff {
			backoff = 50 * time.Millisecond // it ran fine for a while: start over
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, opts.MaxReconnectBackoff)
	}
}

// consumeStream runs one Consume stream until it breaks or ctx is done.
func (c *Client) consumeStream(ctx context.Context, opts ConsumeOptions, h Handler) error {
	// The stream outlives ctx: without a release grace acks must reach the
	// server while it is still open, because closing it releases every lease.
	streamCtx, closeStream := context.WithCancel(context.WithoutCancel(ctx))
	defer closeStream()
	req := &delayqv1.ConsumeRequest{
		Namespace:      c.namespace,
		Queues:         opts.Queues,
		MaxOutstanding: uint32(opts.Concurrency),
		LeaseDuration:  durationpb.New(opts.LeaseDuration),
	}
	if opts.ReleaseGrace > 0 {
		req.ReleaseGrace = durationpb.New(opts.ReleaseGrace)
	}
	stream, err := c.rpc.Consume(streamCtx, req)
	if err != nil {
		return err
	}

	deliveries := make(chan *delayqv1.Delivery)
	recvErr := make(chan error, 1)
	readerDone := make(chan struct{})
	var leftover []*delayqv1.Delivery // received but never handed out (read after readerDone)
	go func() {
		defer close(readerDone)
		for {
			resp, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			ds := resp.GetDeliveries()
			for i, d := range ds {
				select {
				case deliveries <- d:
				case <-streamCtx.Done():
					leftover = append(leftover, ds[i:]...)
					return
				}
			}
		}
	}()

	// Handlers see ctx's values but not its cancellation, so a shutdown
	// lets them finish; cancelHandlers ends them when the drain runs out.
	handlerCtx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()
	// Closed when the stream ends with a release grace: every running
	// handler extends its lease at once, so the grace does not release it.
	keepNow := make(chan struct{})
	slots := make(chan struct{}, opts.Concurrency)
	acks := newAcker(c.rpc, opts, func() int { return len(slots) }, ctx.Done())
	// Runs before closeStream (deferred first), after every return below has
	// waited for the handlers: without a release grace the acks must reach
	// the server while the stream is open, since closing it releases every lease.
	defer acks.close()
	var running sync.WaitGroup
	// endWithGrace closes the stream, keeps running leases and gives back
	// what was never started (held, if not nil, and what the reader held).
	endWithGrace := func(held *delayqv1.Delivery) {
		closeStream()
		close(keepNow)
		<-readerDone
		unstarted := leftover
		if held != nil {
			unstarted = append([]*delayqv1.Delivery{held}, unstarted...)
		}
		c.giveBack(opts, unstarted)
	}
	for {
		select {
		case d := <-deliveries:
			testHookHeld(d)
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				// Not started: given back uncounted (or, without a grace,
				// released by the stream's close).
				if opts.ReleaseGrace > 0 {
					endWithGrace(d)
				}
				return drain(&running, cancelHandlers, opts.DrainTimeout)
			}
			running.Add(1)
			go func() {
				defer func() { <-slots; running.Done() }()
				c.process(handlerCtx, opts, h, d, keepNow, acks)
			}()
		case err := <-recvErr:
			if opts.ReleaseGrace > 0 {
				// The server keeps the leases for the grace: running handlers
				// keep theirs and settle over unary calls; then reconnect.
				endWithGrace(nil)
				running.Wait()
				return err
			}
			// The server has released this stream's leases: running
			// handlers can no longer settle, so stop them.
			cancelHandlers()
			running.Wait()
			return err
		case <-ctx.Done():
			if opts.ReleaseGrace > 0 {
				endWithGrace(nil)
			}
			return drain(&running, cancelHandlers, opts.DrainTimeout)
		}
	}
}

// giveBack releases deliveries that were never started: ready again at
// once, attempts not counted. Tokens the server no longer holds are skipped.
func (c *Client) giveBack(opts ConsumeOptions, ds []*delayqv1.Delivery) {
	for start := 0; start < len(ds); start += maxTokensPerCall {
		chunk := ds[start:min(start+maxTokensPerCall, len(ds))]
		tokens := make([]string, len(chunk))
		for i, d := range chunk {
			tokens[i] = d.GetLeaseToken()
		}
		rctx, cancel := context.WithTimeout(context.Background(), min(settleTimeout, opts.ReleaseGrace))
		_, err := c.rpc.Release(rctx, &delayqv1.ReleaseRequest{LeaseTokens: tokens})
		cancel()
		if err != nil {
			opts.OnError(nil, fmt.Errorf("delayq: release %d unstarted deliveries: %w", len(tokens), err))
		}
	}
}

// testHookHeld lets unit tests see a delivery reach the loop.
var testHookHeld = func(*delayqv1.Delivery) {}

// maxTokensPerCall is the server's cap on tokens in one Ack or Release.
const maxTokensPerCall = 1000

// drain waits for running handlers, cancelling them after timeout.
func drain(running *sync.WaitGroup, cancel context.CancelFunc, timeout time.Duration) error {
	done := make(chan struct{})
	go func() { running.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		cancel()
		<-done
	}
	return nil
}

// process runs the handler with lease renewal, then queues its ack (acks.go) or nacks.
func (c *Client) process(parent context.Context, opts ConsumeOptions, h Handler, d *delayqv1.Delivery, keepNow <-chan struct{}, acks *acker) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	token := d.GetLeaseToken()

	var lost bool
	var renewals sync.WaitGroup
	stopRenew := make(chan struct{})
	renewals.Add(1)
	go func() {
		defer renewals.Done()
		ticker := time.NewTicker(opts.RenewEvery)
		defer ticker.Stop()
		for {
			select {
			case <-stopRenew:
				return
			case <-ctx.Done():
				return
			case <-ticker.C:
			case <-keepNow:
				keepNow = nil // once: the stream ended within its release grace
			}
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
			_, err := c.rpc.ExtendLease(rctx, &delayqv1.ExtendLeaseRequest{
				LeaseToken: token,
				Extension:  durationpb.New(opts.LeaseDuration),
			})
			rcancel()
			switch status.Code(err) {
			case codes.OK:
			case codes.FailedPrecondition, codes.NotFound:
				lost = true
				opts.OnError(d, fmt.Errorf("%w: %v", ErrLeaseLost, err))
				cancel()
				return
			default:
				opts.OnError(d, fmt.Errorf("delayq: extend lease: %w", err))
			}
		}
	}()

	herr := safeCall(ctx, h, d)
	close(stopRenew)
	renewals.Wait()
	if lost {
		return
	}

	if herr == nil {
		acks.add(d)
		return
	}
	sctx, scancel := context.WithTimeout(context.WithoutCancel(parent), settleTimeout)
	defer scancel()
	if _, err := c.rpc.Nack(sctx, nackRequest(token, herr)); err != nil {
		opts.OnError(d, fmt.Errorf("delayq: nack: %w", err))
	}
}

// safeCall runs h, turning a panic into an error so the job is nacked.
func safeCall(ctx context.Context, h Handler, d *delayqv1.Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("delayq: handler panicked: %v", r)
		}
	}()
	return h(ctx, d)
}
