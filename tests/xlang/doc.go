// Package xlang holds the cross-language and grpcurl tests of delayq. They
// run against a real server started by scripts/with_server.py (make
// test-xlang, make test-grpcurl) and drive the other languages' clients
// and grpcurl as subprocesses.
package xlang
