// Command worker enqueues one delayed job and consumes its queue until
// interrupted: the Go example of the README.
package main

import (
	"context"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/delayq/delayq/clients/go/delayq"
	"github.com/delayq/delayq/clients/go/delayqv1"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	addr := os.Getenv("DELAYQ_ADDR")
	if addr == "" {
		addr = "127.0.0.1:50051"
	}
	client, err := delayq.Dial(addr)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	res, err := client.Enqueue(ctx, "emails", []byte(`{"to":"a@example.com"}`),
		delayq.WithDelay(2*time.Second),
		delayq.WithHeaders(map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}))
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("enqueued %s, due %s", res.GetJobId(), res.GetDueTime().AsTime())

	// Runs until Ctrl-C; running handlers then finish and are acked before it returns.
	err = client.Consume(ctx, delayq.ConsumeOptions{
		Queues:        []string{"emails"},
		Concurrency:   8,
		LeaseDuration: 30 * time.Second, // renewed every 10 s while a handler runs
		OnError:       func(_ *delayqv1.Delivery, err error) { log.Print(err) },
	}, func(ctx context.Context, d *delayqv1.Delivery) error {
		log.Printf("job %s attempt %d traceparent %s: %s",
			d.GetJob().GetId(), d.GetAttempt(), d.GetJob().GetHeaders()["traceparent"], d.GetJob().GetPayload())
		return nil // ack; return an error to nack (wrap it in delayq.RetryAfter or delayq.DeadLetter to choose where it goes)
	})
	if err != nil {
		log.Fatal(err)
	}
}
