package xlang

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/delayq/delayq/clients/go/delayq"
)

// repoRoot is where the Makefile lives; the tests run in tests/xlang.
var repoRoot = func() string {
	abs, err := filepath.Abs("../..")
	if err != nil {
		panic(err)
	}
	return abs
}()

// traceHeaders are W3C trace context plus user metadata: every hop must
// hand them on byte for byte.
var traceHeaders = map[string]string{
	"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	"tracestate":  "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
	"tenant":      "acme",
}

func serverAddr(t *testing.T) string {
	t.Helper()
	addr := os.Getenv("DELAYQ_ADDR")
	if addr == "" {
		t.Fatal("DELAYQ_ADDR is not set: run through scripts/with_server.py (make test-xlang / make test-grpcurl)")
	}
	return addr
}

func dial(t *testing.T) *delayq.Client {
	t.Helper()
	c, err := delayq.Dial(serverAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func queueName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// tool finds an executable the Makefile installed, failing when it is missing.
func tool(t *testing.T, envVar, fallback string) string {
	t.Helper()
	path := os.Getenv(envVar)
	if path == "" {
		path = filepath.Join(repoRoot, fallback)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s not found (%v): run through make, which installs it", path, err)
	}
	return path
}

// run runs a command with a deadline and returns its stdout.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("%s %v: %v\nstdout: %s\nstderr: %s", name, args, err, out, stderr)
	}
	return string(out)
}
