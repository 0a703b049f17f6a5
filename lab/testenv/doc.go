// Package testenv groups the real servers tests start, one subpackage each:
// freeport hands out loopback ports, child runs a process with its output
// in a log file (the bench's and natstest's), natstest runs nats-server,
// kubetest runs etcd and kube-apiserver, otlptest receives OTLP traces.
// Only tests import them; the serving binary links none
// (cmd/turnout/deps_test.go).
package testenv
