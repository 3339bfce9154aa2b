package xlang

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"testing"
	"time"

	"github.com/delayq/delayq/clients/go/delayq"
	"github.com/delayq/delayq/clients/go/delayqv1"
)

func TestCrossLanguageGoProducerPythonWorker(t *testing.T) {
	c := dial(t)
	queue := queueName("xlang-go-py")
	payload := []byte(`{"from":"go"}`)
	res, err := c.Enqueue(context.Background(), queue, payload, delayq.WithDelay(100*time.Millisecond), delayq.WithHeaders(traceHeaders))
	if err != nil {
		t.Fatal(err)
	}
	python := tool(t, "DELAYQ_PYTHON", ".venv/bin/python")
	out := run(t, python, "tests/xlang/py_worker.py", "--addr", serverAddr(t), "--queue", queue, "--count", "1")
	var got struct {
		JobID      string            `json:"job_id"`
		Attempt    int               `json:"attempt"`
		Headers    map[string]string `json:"headers"`
		PayloadB64 string            `json:"payload_b64"`
		Ack        string            `json:"ack"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("py_worker printed %q: %v", out, err)
	}
	if got.JobID != res.GetJobId() || got.Attempt != 1 || got.Ack != "ACK_RESULT_ACKED" {
		t.Errorf("python worker saw %+v, want job %s attempt 1 acked", got, res.GetJobId())
	}
	if p, _ := base64.StdEncoding.DecodeString(got.PayloadB64); string(p) != string(payload) {
		t.Errorf("payload = %q, want %q", p, payload)
	}
	assertHeaders(t, got.Headers)
}

func TestCrossLanguageTypeScriptProducerGoWorker(t *testing.T) {
	c := dial(t)
	queue := queueName("xlang-ts-go")
	headersJSON, _ := json.Marshal(traceHeaders)
	out := run(t, "node", "tests/xlang/ts_producer.mjs", serverAddr(t), queue, `{"from":"ts"}`, string(headersJSON))
	var produced struct {
		JobID string `json:"jobId"`
	}
	if err := json.Unmarshal([]byte(out), &produced); err != nil || produced.JobID == "" {
		t.Fatalf("ts_producer printed %q: %v", out, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan *delayqv1.Delivery, 1)
	result := make(chan error, 1)
	go func() {
		result <- c.Consume(ctx, delayq.ConsumeOptions{Queues: []string{queue}}, func(_ context.Context, d *delayqv1.Delivery) error {
			got <- d
			return nil
		})
	}()
	var d *delayqv1.Delivery
	select {
	case d = <-got:
	case err := <-result:
		t.Fatalf("Consume returned: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("no delivery within 20s")
	}
	cancel()
	if err := <-result; err != nil {
		t.Fatal(err)
	}
	if d.GetJob().GetId() != produced.JobID || string(d.GetJob().GetPayload()) != `{"from":"ts"}` {
		t.Errorf("go worker saw %v, want job %s", d, produced.JobID)
	}
	assertHeaders(t, d.GetJob().GetHeaders())
}

func assertHeaders(t *testing.T, got map[string]string) {
	t.Helper()
	for k, want := range traceHeaders {
		if got[k] != want {
			t.Errorf("header %s = %q, want %q", k, got[k], want)
		}
	}
}
