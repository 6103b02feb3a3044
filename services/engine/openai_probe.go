package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"

	"github.com/baton-dev/baton/events"
)

// Probe finds out what the server can do, with a few one-token requests:
// whether it serves the model (GET /v1/models), chat, completions, assistant
// prefill (continue_final_message), and token ids (a prompt of ids from
// /tokenize answered with return_token_ids). It records the result for
// Generate and returns it. An *UpstreamError of class
// events.FailureNotReady means the server cannot serve this engine at all
// (bad key, unknown model); other errors mean it could not be reached.
func (o *OpenAI) Probe(ctx context.Context) (Capabilities, error) {
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := o.call(ctx, http.MethodGet, "/v1/models", nil, &models); err != nil {
		return Capabilities{}, err
	}
	ids := make([]string, 0, len(models.Data))
	for _, m := range models.Data {
		ids = append(ids, m.ID)
	}
	if len(ids) > 0 && !slices.Contains(ids, o.cfg.Model) {
		return Capabilities{}, &UpstreamError{Class: events.FailureNotReady, Status: http.StatusNotFound, Code: "model_not_found",
			Message: fmt.Sprintf("the server does not serve model %q (it serves %v)", o.cfg.Model, ids)}
	}
	var caps Capabilities
	var err error
	user := []map[string]string{{"role": "user", "content": "Hello"}}
	if caps.Chat, err = o.supports(ctx, pathChat, map[string]any{"model": o.cfg.Model, "messages": user, "max_tokens": 1}, nil); err != nil {
		return Capabilities{}, err
	}
	if caps.Completions, err = o.supports(ctx, pathCompletions, map[string]any{"model": o.cfg.Model, "prompt": "Hello", "max_tokens": 1}, nil); err != nil {
		return Capabilities{}, err
	}
	if !caps.Chat && !caps.Completions {
		return Capabilities{}, &UpstreamError{Class: events.FailureNotReady, Message: fmt.Sprintf("the server answers neither %s nor %s for model %q", pathChat, pathCompletions, o.cfg.Model)}
	}
	if caps.Chat {
		prefill := append(user, map[string]string{"role": "assistant", "content": "Hi"})
		if caps.Prefill, err = o.supports(ctx, pathChat, map[string]any{"model": o.cfg.Model, "messages": prefill, "max_tokens": 1,
			"continue_final_message": true, "add_generation_prompt": false}, nil); err != nil {
			return Capabilities{}, err
		}
	}
	if caps.Completions {
		var tok struct {
			Tokens []int `json:"tokens"`
		}
		ok, err := o.supports(ctx, "/tokenize", map[string]any{"model": o.cfg.Model, "prompt": "Hello"}, &tok)
		if err != nil {
			return Capabilities{}, err
		}
		if ok && len(tok.Tokens) > 0 {
			var out struct {
				Choices []struct {
					TokenIDs []int `json:"token_ids"`
				} `json:"choices"`
			}
			ok, err := o.supports(ctx, pathCompletions, map[string]any{"model": o.cfg.Model, "prompt": tok.Tokens, "max_tokens": 1, "return_token_ids": true}, &out)
			if err != nil {
				return Capabilities{}, err
			}
			caps.TokenIDs = ok && len(out.Choices) > 0 && len(out.Choices[0].TokenIDs) > 0
		}
	}
	o.mu.Lock()
	o.caps = caps
	o.mu.Unlock()
	return caps, nil
}

// supports asks path with in: true when the server answered 200, false
// when it said no for good (4xx other than 401, 403 and 429: the feature is
// missing or refused), and an error when the answer says nothing about the
// feature (401, 403, 429, 5xx, no answer): the probe must be tried again.
func (o *OpenAI) supports(ctx context.Context, path string, in, out any) (bool, error) {
	err := o.call(ctx, http.MethodPost, path, in, out)
	var ue *UpstreamError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &ue) && ue.Status >= 400 && ue.Status < 500 &&
		ue.Status != http.StatusUnauthorized && ue.Status != http.StatusForbidden && ue.Status != http.StatusTooManyRequests:
		return false, nil
	}
	return false, fmt.Errorf("probe %s: %w", path, err)
}

// call makes one non-streaming request and decodes a 200 answer into out.
func (o *OpenAI) call(ctx context.Context, method, path string, in, out any) error {
	var resp *http.Response
	var err error
	if method == http.MethodGet {
		var hr *http.Request
		if hr, err = http.NewRequestWithContext(ctx, method, o.base+path, nil); err != nil {
			return err
		}
		if o.cfg.APIKey != "" {
			hr.Header.Set("Authorization", "Bearer "+o.cfg.APIKey)
		}
		resp, err = o.client.Do(hr)
	} else {
		body, _ := json.Marshal(in)
		resp, err = o.post(ctx, path, body, false)
	}
	if err != nil {
		return &UpstreamError{Message: fmt.Sprintf("%s %s: %v", method, path, err)}
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return upstreamStatusError(resp.StatusCode, resp.Header, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return &UpstreamError{Message: fmt.Sprintf("%s %s: %v", method, path, err)}
		}
	}
	return nil
}
