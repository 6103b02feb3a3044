package engine

import (
	"context"
	"errors"
)

// ErrFatal marks an engine that can no longer serve anything: its worker
// shuts down gracefully and the process exits 1.
var ErrFatal = errors.New("engine: fatal error")

// Request is one generation to run: the tokens at offsets
// [StartOffset, MaxTokens) of a request's output. StartOffset > 0 means a
// continuation after a migration: Generated holds the text produced so far.
type Request struct {
	RequestID    string
	Prompt       string
	PromptTokens int
	Generated    string
	StartOffset  int
	MaxTokens    int
}

// Finish reasons.
const (
	FinishLength = "length"
	FinishStop   = "stop"
)

// Stats is an engine's load, published by its worker.
type Stats struct {
	ActiveRequests      int
	KVBlocksUsed        int
	KVBlocksTotal       int
	QueuedPrefillTokens int
}

// Engine generates tokens. Implementations are safe for concurrent use.
type Engine interface {
	// Generate produces the tokens of req in order, calling emit once per
	// token, until MaxTokens, a stop, or ctx is done. It returns the finish
	// reason, or an error: ctx's error when cancelled, ErrFatal (wrapped) when
	// the engine can no longer serve anything.
	Generate(ctx context.Context, req Request, emit func(token string) error) (finishReason string, err error)
	// Stats reports the current load.
	Stats() Stats
}
