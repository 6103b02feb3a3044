// Package services holds baton's running parts; see its subpackages: frontend
// (HTTP API, routing, streaming from the log), worker (lease, dispatch, engine),
// engine (mock and OpenAI-compatible engines) and natsserver (the embedded server).
package services
