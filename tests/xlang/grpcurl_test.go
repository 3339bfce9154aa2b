package xlang

// grpcurl against the running server through reflection: the same commands
// as the README's grpcurl section. grpcurl prints proto field names
// (job_id, lease_token) and accepts them in -d bodies.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"
)

const service = "delayq.v1.DelayQueueService"

func grpcurl(t *testing.T, args ...string) string {
	t.Helper()
	bin := tool(t, "GRPCURL", ".tools/bin/grpcurl")
	return run(t, bin, append([]string{"-plaintext"}, args...)...)
}

func TestGrpcurlListAndDescribe(t *testing.T) {
	addr := serverAddr(t)
	services := grpcurl(t, addr, "list")
	for _, want := range []string{service, "grpc.health.v1.Health"} {
		if !strings.Contains(services, want) {
			t.Errorf("list: %q missing from\n%s", want, services)
		}
	}
	methods := grpcurl(t, addr, "list", service)
	for _, m := range []string{"Enqueue", "EnqueueBatch", "EnqueueStream", "Consume", "Ack", "Nack", "ExtendLease"} {
		if !strings.Contains(methods, service+"."+m+"\n") {
			t.Errorf("list %s: %s missing from\n%s", service, m, methods)
		}
	}
	desc := grpcurl(t, addr, "describe", service)
	if !strings.Contains(desc, "rpc Consume ( .delayq.v1.ConsumeRequest ) returns ( stream .delayq.v1.ConsumeResponse )") {
		t.Errorf("describe %s:\n%s", service, desc)
	}
	msg := grpcurl(t, addr, "describe", "delayq.v1.EnqueueRequest")
	for _, want := range []string{"google.protobuf.Duration delay = 5;", "map<string, string> headers = 4;"} {
		if !strings.Contains(msg, want) {
			t.Errorf("describe EnqueueRequest: %q missing from\n%s", want, msg)
		}
	}
}

// describe of a method used to fail with "Symbol not found", and no describe
// printed comments: reflection now serves descriptors with source info.
func TestGrpcurlDescribeShowsMethodsAndComments(t *testing.T) {
	addr := serverAddr(t)
	method := grpcurl(t, addr, "describe", service+".Enqueue")
	for _, want := range []string{
		"is a method",
		"// Enqueue stores one job",
		"rpc Enqueue ( .delayq.v1.EnqueueRequest ) returns ( .delayq.v1.EnqueueResponse );",
	} {
		if !strings.Contains(method, want) {
			t.Errorf("describe %s.Enqueue: %q missing from\n%s", service, want, method)
		}
	}
	svc := grpcurl(t, addr, "describe", service)
	if !strings.Contains(svc, "// DelayQueueService schedules jobs") {
		t.Errorf("describe %s: no comment in\n%s", service, svc)
	}
	field := grpcurl(t, addr, "describe", "delayq.v1.QueueStats.backlog_due")
	if !strings.Contains(field, "// When the backlog") {
		t.Errorf("describe QueueStats.backlog_due: no comment in\n%s", field)
	}
}

func TestGrpcurlEnqueueConsumeAck(t *testing.T) {
	addr := serverAddr(t)
	queue := queueName("grpcurl")

	// Enqueue with a JSON body ("aGVsbG8=" is base64 for "hello").
	body := fmt.Sprintf(`{"queue": %q, "payload": "aGVsbG8=", "delay": "0.2s", "headers": {"traceparent": %q}}`,
		queue, traceHeaders["traceparent"])
	var enq struct {
		JobID string `json:"job_id"`
	}
	out := grpcurl(t, "-d", body, addr, service+"/Enqueue")
	if err := json.Unmarshal([]byte(out), &enq); err != nil || enq.JobID == "" {
		t.Fatalf("Enqueue printed %q: %v", out, err)
	}

	// Consume: grpcurl prints each stream message as it arrives; read the
	// first one while the stream (and so the lease) stays open.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bin := tool(t, "GRPCURL", ".tools/bin/grpcurl")
	consume := exec.CommandContext(ctx, bin, "-plaintext", "-d",
		fmt.Sprintf(`{"queues": [%q], "max_outstanding": 1}`, queue), addr, service+"/Consume")
	var stderr strings.Builder
	consume.Stderr = &stderr
	stdout, err := consume.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := consume.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = consume.Process.Kill(); _ = consume.Wait() }()

	type delivery struct {
		Job struct {
			ID      string            `json:"id"`
			Payload string            `json:"payload"`
			Headers map[string]string `json:"headers"`
		} `json:"job"`
		LeaseToken string `json:"lease_token"`
		Attempt    int    `json:"attempt"`
	}
	first := make(chan []delivery, 1)
	readErr := make(chan error, 1)
	go func() {
		var msg struct {
			Deliveries []delivery `json:"deliveries"`
		}
		if err := json.NewDecoder(bufio.NewReader(stdout)).Decode(&msg); err != nil {
			readErr <- err
			return
		}
		first <- msg.Deliveries
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var got []delivery
	select {
	case got = <-first:
	case err := <-readErr:
		t.Fatalf("Consume output: %v; stderr: %s", err, stderr.String())
	case <-ctx.Done():
		t.Fatalf("no delivery printed within 30s; stderr: %s", stderr.String())
	}
	if len(got) != 1 || got[0].Job.ID != enq.JobID || got[0].Job.Payload != "aGVsbG8=" || got[0].Attempt != 1 || got[0].LeaseToken == "" {
		t.Fatalf("delivery = %+v, want job %s", got, enq.JobID)
	}
	if tp := got[0].Job.Headers["traceparent"]; tp != traceHeaders["traceparent"] {
		t.Errorf("traceparent = %q", tp)
	}

	// Query by the job id while the stream holds the lease (the README's Query step).
	query := grpcurl(t, "-d", fmt.Sprintf(`{"queue": %q, "job_id": %q}`, queue, enq.JobID), addr, service+"/Query")
	var q struct {
		Job struct {
			ID       string `json:"id"`
			State    string `json:"state"`
			Attempts int    `json:"attempts"`
		} `json:"job"`
	}
	if err := json.Unmarshal([]byte(query), &q); err != nil || q.Job.ID != enq.JobID || q.Job.State != "JOB_STATE_LEASED" || q.Job.Attempts != 1 {
		t.Fatalf("Query printed %q: %v", query, err)
	}

	// Ack with the lease token from the delivery.
	ack := grpcurl(t, "-d", fmt.Sprintf(`{"lease_tokens": [%q]}`, got[0].LeaseToken), addr, service+"/Ack")
	var ackRes struct {
		Results []string `json:"results"`
	}
	if err := json.Unmarshal([]byte(ack), &ackRes); err != nil || len(ackRes.Results) != 1 || ackRes.Results[0] != "ACK_RESULT_ACKED" {
		t.Fatalf("Ack printed %q: %v", ack, err)
	}
}
