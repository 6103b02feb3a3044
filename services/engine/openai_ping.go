package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// Pinger is an engine whose server can be asked, cheaply and without
// generating anything, whether it is alive. Engines that are not Pingers
// (the mock, in-process) are alive while their process is.
type Pinger interface {
	// Ping returns nil when the server answered at all (any HTTP status
	// counts: a 401 or a 404 is an answer), ErrNoAnswer (wrapped) when it
	// did not answer before ctx was done (a hung server: stopped, or
	// deadlocked), and another error when it could not be reached (refused,
	// reset: a dead server).
	Ping(ctx context.Context) error
}

// ErrNoAnswer means a server accepted the request but did not answer it in
// time: it is hung, not gone.
var ErrNoAnswer = errors.New("engine: no answer")

// pingPath is what Ping asks: every OpenAI-compatible server has it, and
// it generates nothing.
const pingPath = "/v1/models"

// Ping asks the server for GET /v1/models and reads nothing but the answer's
// status: any answer means the server is alive.
func (o *OpenAI) Ping(ctx context.Context) error {
	hr, err := http.NewRequestWithContext(ctx, http.MethodGet, o.base+pingPath, nil)
	if err != nil {
		return err
	}
	if o.cfg.APIKey != "" {
		hr.Header.Set("Authorization", "Bearer "+o.cfg.APIKey)
	}
	resp, err := o.client.Do(hr)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("GET %s: %w", pingPath, ErrNoAnswer)
		}
		return fmt.Errorf("GET %s: %w", pingPath, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	resp.Body.Close()
	return nil
}
