package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"

	"github.com/baton-dev/baton/events"
)

// Probe finds out what the server can do, with a few one-token requests:
// chat, completions, assistant prefill (continue_final_message), and token
// ids (a prompt of ids from /tokenize answered with return_token_ids). It
// records the result for Generate and returns it. The server's answers to
// those requests decide whether it serves the model: its GET /v1/models
// listing is advisory (see Listing), since servers list other names than
// they serve (Ollama lists "tiny:latest" and serves "tiny"). A route that
// answers about the request itself (400, 413, 422: a content policy, a
// context length) exists. An *UpstreamError of class events.FailureNotReady
// means the server cannot serve this engine at all (bad key, unknown model:
// its own words). One of class events.FailureUnavailable (429, 503, with
// its Retry-After) means the server is up but busy: the Capabilities
// returned with it are what its answers showed so far (a route that
// answered 429 exists), without continuation (no token ids, no prefill,
// completions not continuable), and the probe should run again later.
// Other errors mean it could not be reached or answered nothing useful.
func (o *OpenAI) Probe(ctx context.Context) (Capabilities, error) {
	listed, err := o.listed(ctx)
	if err != nil {
		return Capabilities{}, err
	}
	o.mu.Lock()
	o.listing = listed
	o.mu.Unlock()
	var caps Capabilities
	var chatNo, complNo, busy, b *UpstreamError
	user := []map[string]string{{"role": "user", "content": "Hello"}}
	if caps.Chat, chatNo, busy, err = o.route(ctx, pathChat, map[string]any{"model": o.cfg.Model, "messages": user, "max_tokens": 1}); err != nil {
		return Capabilities{}, err
	}
	if caps.Completions, complNo, b, err = o.route(ctx, pathCompletions, map[string]any{"model": o.cfg.Model, "prompt": "Hello", "max_tokens": 1}); err != nil {
		return Capabilities{}, err
	}
	if busy == nil {
		busy = b
	}
	if !caps.Chat && !caps.Completions {
		e := &UpstreamError{Class: events.FailureNotReady, Message: fmt.Sprintf("the server answers neither %s nor %s for model %q", pathChat, pathCompletions, o.cfg.Model)}
		for _, no := range []*UpstreamError{chatNo, complNo} {
			if no != nil && no.Status == http.StatusNotFound && no.Message != http.StatusText(http.StatusNotFound) {
				// The server's own words about the model.
				e.Status, e.Code, e.Message = no.Status, no.Code, fmt.Sprintf("model %q: %s", o.cfg.Model, no.Message)
				break
			}
		}
		if listed.Names != nil && listed.Match == "" {
			e.Message += fmt.Sprintf(" (it lists %v)", listed.Names)
		}
		return Capabilities{}, e
	}
	if busy != nil {
		return o.partial(caps), fmt.Errorf("probe: %w", busy)
	}
	if err := o.features(ctx, &caps, user); err != nil {
		var ue *UpstreamError
		if errors.As(err, &ue) && ue.Class == events.FailureUnavailable {
			return o.partial(caps), err // busy halfway: learn the rest later
		}
		return Capabilities{}, err
	}
	o.mu.Lock()
	o.caps = caps
	o.mu.Unlock()
	return caps, nil
}

// partial records and returns caps, the routes a busy server showed, with
// no way to continue a migrated request: what is not known is not offered.
func (o *OpenAI) partial(caps Capabilities) Capabilities {
	caps.TokenIDs, caps.Prefill, caps.CompletionsNotContinuable = false, false, true
	o.mu.Lock()
	o.caps = caps
	o.mu.Unlock()
	return caps
}

// features finds how a migrated request can continue on the server whose
// routes caps has: prefill (chat) and token ids (completions).
func (o *OpenAI) features(ctx context.Context, caps *Capabilities, user []map[string]string) error {
	var err error
	if caps.Chat {
		prefill := append(user, map[string]string{"role": "assistant", "content": "Hi"})
		if caps.Prefill, err = o.supports(ctx, pathChat, map[string]any{"model": o.cfg.Model, "messages": prefill, "max_tokens": 1,
			"continue_final_message": true, "add_generation_prompt": false}, nil); err != nil {
			return err
		}
		if caps.Prefill {
			diverges, err := o.prefillDiverges(ctx)
			if err != nil {
				return err
			}
			caps.Prefill = !diverges
		}
	}
	if caps.Completions {
		if caps.CompletionsNotContinuable, err = o.completionsDiverge(ctx); err != nil {
			return err
		}
		var tok struct {
			Tokens []int `json:"tokens"`
		}
		ok, err := o.supports(ctx, "/tokenize", map[string]any{"model": o.cfg.Model, "prompt": "Hello"}, &tok)
		if err != nil {
			return err
		}
		if ok && len(tok.Tokens) > 0 {
			var out struct {
				Choices []struct {
					TokenIDs []int `json:"token_ids"`
				} `json:"choices"`
			}
			ok, err := o.supports(ctx, pathCompletions, map[string]any{"model": o.cfg.Model, "prompt": tok.Tokens, "max_tokens": 1, "return_token_ids": true}, &out)
			if err != nil {
				return err
			}
			caps.TokenIDs = ok && len(out.Choices) > 0 && len(out.Choices[0].TokenIDs) > 0
		}
	}
	return nil
}

// route asks path with a one-token request and says whether the server has
// that route for the model: yes on 200 and on an answer about the request
// (400, 413, 422: a content policy, a context length); yes and busy (the
// answer) on 429 and 503; no on another 4xx (404: no such route or model),
// with the answer; an error when the answer says nothing (401, 403, another
// 5xx) or there was none.
func (o *OpenAI) route(ctx context.Context, path string, in any) (ok bool, no, busy *UpstreamError, err error) {
	err = o.call(ctx, http.MethodPost, path, in, nil)
	var ue *UpstreamError
	switch {
	case err == nil:
		return true, nil, nil, nil
	case !errors.As(err, &ue):
	case ue.Class == events.FailureClient:
		return true, nil, nil, nil
	case ue.Class == events.FailureUnavailable:
		return true, nil, ue, nil
	case ue.Status >= 400 && ue.Status < 500 && ue.Status != http.StatusUnauthorized && ue.Status != http.StatusForbidden:
		return false, ue, nil, nil
	}
	return false, nil, nil, fmt.Errorf("probe %s: %w", path, err)
}

// prefillDiverges measures whether assistant prefill continues an answer: a
// greedy chat answer, cut at its last word boundary, then asked again with
// the text before the cut as a final assistant message to continue, must go
// on with the rest. A server that accepts continue_final_message but
// ignores it (its template opens a new assistant turn) answers anew. An
// answer too short to cut says nothing: not diverging.
func (o *OpenAI) prefillDiverges(ctx context.Context) (bool, error) {
	const question = "Tell me about the quick brown fox and the lazy dog."
	user := map[string]string{"role": "user", "content": question}
	greedy := func(msgs []map[string]string, extra map[string]any) (string, error) {
		var out struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		body := map[string]any{"model": o.cfg.Model, "messages": msgs, "max_tokens": 6, "temperature": 0, "seed": 0, "user": ProbeUser}
		maps.Copy(body, extra)
		if _, err := o.supports(ctx, pathChat, body, &out); err != nil || len(out.Choices) == 0 {
			return "", err
		}
		return out.Choices[0].Message.Content, nil
	}
	whole, err := greedy([]map[string]string{user}, nil)
	if err != nil {
		return false, err
	}
	cut := strings.LastIndex(strings.TrimRight(whole, " "), " ")
	if cut <= 0 {
		return false, nil
	}
	rest, err := greedy([]map[string]string{user, {"role": "assistant", "content": whole[:cut]}},
		map[string]any{"continue_final_message": true, "add_generation_prompt": false})
	if err != nil {
		return false, err
	}
	want := whole[cut:]
	return !strings.HasPrefix(rest, want) && !strings.HasPrefix(want, rest), nil
}

// ProbeUser is the OpenAI "user" of the probe's requests longer than one
// token, so that a server's logs (and tests) can tell them from clients'.
const ProbeUser = "baton-probe"

// completionsDiverge measures whether a completions prompt plus the text of
// a greedy answer so far continues that answer. A server that wraps
// completions prompts in a chat template (Ollama) answers a new question
// instead: its greedy completion of a prompt is its chat answer to the
// prompt as a user turn, and its usage counts the same prompt tokens; or, cut at its last word boundary and asked again
// from the prompt plus the text before the cut, it does not go on with the
// rest. An answer too short to cut says nothing: not diverging.
func (o *OpenAI) completionsDiverge(ctx context.Context) (bool, error) {
	const prompt = "The quick brown fox jumps over the lazy dog. Then the dog"
	var promptTokens int
	greedy := func(p string, n int) (string, error) {
		var out struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if _, err := o.supports(ctx, pathCompletions, map[string]any{"model": o.cfg.Model, "prompt": p, "max_tokens": n, "temperature": 0, "seed": 0, "user": ProbeUser}, &out); err != nil {
			return "", err
		}
		promptTokens = out.Usage.PromptTokens
		if len(out.Choices) == 0 {
			return "", nil
		}
		return out.Choices[0].Text, nil
	}
	whole, err := greedy(prompt, 6)
	if err != nil {
		return false, err
	}
	if whole != "" || promptTokens > 0 {
		// A completions answer that is the chat answer to the prompt as a
		// user turn: the prompt went through the chat template.
		var chat struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		user := []map[string]string{{"role": "user", "content": prompt}}
		if ok, err := o.supports(ctx, pathChat, map[string]any{"model": o.cfg.Model, "messages": user, "max_tokens": 6, "temperature": 0, "seed": 0, "user": ProbeUser}, &chat); err != nil {
			return false, err
		} else if ok && len(chat.Choices) > 0 && (whole != "" && chat.Choices[0].Message.Content == whole ||
			promptTokens > 0 && chat.Usage.PromptTokens == promptTokens) {
			// The same answer, or the same prompt length (the template's
			// tokens included): the prompt was templated.
			return true, nil
		}
	}
	cut := strings.LastIndex(strings.TrimRight(whole, " "), " ")
	if cut <= 0 {
		return false, nil
	}
	rest, err := greedy(prompt+whole[:cut], 6)
	if err != nil {
		return false, err
	}
	want := whole[cut:]
	return !strings.HasPrefix(rest, want) && !strings.HasPrefix(want, rest), nil
}

// supports asks path with in: true when the server answered 200, false
// when it said no for good (4xx other than 401, 403 and 429: the feature is
// missing or refused), and an error when the answer says nothing about the
// feature (401, 403, 429, 5xx, no answer): the probe must be tried again.
func (o *OpenAI) supports(ctx context.Context, path string, in, out any) (bool, error) {
	ok, _, err := o.answers(ctx, path, in, out)
	return ok, err
}

// answers is supports that also returns the server's "no".
func (o *OpenAI) answers(ctx context.Context, path string, in, out any) (bool, *UpstreamError, error) {
	err := o.call(ctx, http.MethodPost, path, in, out)
	var ue *UpstreamError
	switch {
	case err == nil:
		return true, nil, nil
	case errors.As(err, &ue) && ue.Status >= 400 && ue.Status < 500 &&
		ue.Status != http.StatusUnauthorized && ue.Status != http.StatusForbidden && ue.Status != http.StatusTooManyRequests:
		return false, ue, nil
	}
	return false, nil, fmt.Errorf("probe %s: %w", path, err)
}

// Listing is what the server's GET /v1/models said of the engine's model.
type Listing struct {
	// Names are the listed model ids; nil when the server lists nothing
	// (no such endpoint, or an empty list).
	Names []string
	// Match is the listed name that is the engine's model, or an alias of
	// it (SameModel); "" when none is.
	Match string
}

// listed reads GET /v1/models. A server that refuses the engine (401, 403)
// or cannot be reached is an error; one without a listing is not.
func (o *OpenAI) listed(ctx context.Context) (Listing, error) {
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	err := o.call(ctx, http.MethodGet, "/v1/models", nil, &models)
	var ue *UpstreamError
	switch {
	case errors.As(err, &ue) && (ue.Status == http.StatusUnauthorized || ue.Status == http.StatusForbidden):
		return Listing{}, err // class events.FailureNotReady
	case errors.As(err, &ue) && (ue.Status >= 400 && ue.Status < 500 || ue.Class == events.FailureUnavailable):
		return Listing{}, nil // no listing (or a busy server): the requests decide
	case err != nil:
		return Listing{}, err
	}
	var l Listing
	for _, m := range models.Data {
		l.Names = append(l.Names, m.ID)
		if l.Match == "" && SameModel(m.ID, o.cfg.Model) {
			l.Match = m.ID
		}
	}
	return l, nil
}

// Listing is what the last Probe's GET /v1/models said of the model.
func (o *OpenAI) Listing() Listing {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.listing
}

// SameModel reports whether two model names name one model: equal, or equal
// but for an implicit ":latest" tag (Ollama's "tiny" is "tiny:latest").
func SameModel(a, b string) bool {
	return strings.TrimSuffix(a, ":latest") == strings.TrimSuffix(b, ":latest")
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
