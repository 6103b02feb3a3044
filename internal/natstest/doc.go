// Package natstest starts an embedded NATS server with JetStream for package
// tests: real JetStream, in memory, on a random port, about 0.1 s to start.
package natstest
