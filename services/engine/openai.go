package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultFirstTokenTimeout bounds the wait for an upstream's first token
// (response headers included).
const DefaultFirstTokenTimeout = 60 * time.Second

// OpenAIConfig points the OpenAI engine at an OpenAI-compatible server.
type OpenAIConfig struct {
	// URL is the server's base URL, such as http://127.0.0.1:8000 (a
	// trailing /v1 is accepted too). Required.
	URL string
	// Model is the model name sent to the server. Required.
	Model string
	// APIKey, if set, is sent as a bearer token.
	APIKey string
	// FirstTokenTimeout bounds the time from sending a request to its first
	// token, response headers included; default DefaultFirstTokenTimeout.
	FirstTokenTimeout time.Duration
	// Client makes the requests; default: an http.Client without an overall
	// timeout (streams are long) on a transport with a connect timeout and a
	// response-header timeout of FirstTokenTimeout.
	Client *http.Client
}

// Validate reports every problem with c.
func (c OpenAIConfig) Validate() error {
	var errs []error
	if u, err := url.Parse(c.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("openai url %q: want http(s)://host[:port]", c.URL))
	}
	if c.Model == "" {
		errs = append(errs, errors.New("openai model: required"))
	}
	if c.FirstTokenTimeout < 0 {
		errs = append(errs, fmt.Errorf("first token timeout %v: must not be negative", c.FirstTokenTimeout))
	}
	return errors.Join(errs...)
}

// OpenAI runs requests on an OpenAI-compatible server (vLLM, SGLang,
// llama.cpp, Ollama). It sends the client's request as the client sent it
// (Request.Body), chat to /v1/chat/completions and completions to
// /v1/completions, rewriting only model, stream, stream_options.include_usage,
// the remaining max_tokens and n. Each streamed token becomes one Token:
// when the server returns token ids (vLLM's return_token_ids), one Token per
// id, so offsets count the server's tokens; otherwise one per streamed event
// with text or details. A migrated request continues from the prompt's ids
// plus the generated ids where the server takes token-id prompts, else by
// prefill (see Capabilities). Server failures are *UpstreamError values,
// classified by ClassOf. It is safe for concurrent use.
type OpenAI struct {
	cfg    OpenAIConfig
	base   string
	client *http.Client
	active atomic.Int64
	aborts aborts

	mu      sync.Mutex
	caps    Capabilities
	listing Listing
}

// NewOpenAI returns an engine for the server cfg names. It does not contact
// the server; until Probe says otherwise it assumes chat and completions
// without token ids or prefill.
func NewOpenAI(cfg OpenAIConfig) (*OpenAI, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("engine: openai config: %w", err)
	}
	if cfg.FirstTokenTimeout == 0 {
		cfg.FirstTokenTimeout = DefaultFirstTokenTimeout
	}
	base := strings.TrimSuffix(strings.TrimSuffix(cfg.URL, "/"), "/v1")
	c := cfg.Client
	if c == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
		t.ResponseHeaderTimeout = cfg.FirstTokenTimeout
		t.MaxIdleConnsPerHost = 64
		c = &http.Client{Transport: t}
	}
	return &OpenAI{cfg: cfg, base: base, client: c, caps: Capabilities{Chat: true, Completions: true}}, nil
}

// Capabilities is what the engine assumes of its server: the defaults, or
// what the last Probe found.
func (o *OpenAI) Capabilities() Capabilities {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.caps
}

// FirstTokenTimeout is the deadline the engine keeps for a request's first
// token: a request still without one then fails (an *UpstreamError), so the
// worker in front of it need not be watched for a stall before it.
func (o *OpenAI) FirstTokenTimeout() time.Duration { return o.cfg.FirstTokenTimeout }

// errFirstToken cancels a request whose first token did not come in time.
var errFirstToken = errors.New("engine: openai: first-token timeout")

// Generate streams req's continuation from the server. It asks for
// MaxTokens-StartOffset tokens and emits at most that many (a server that
// sends more is cut, with FinishLength). It returns the server's finish
// reason and usage, ctx's error when cancelled, or an *UpstreamError; never
// ErrFatal, since a server can come back.
func (o *OpenAI) Generate(ctx context.Context, req Request, emit func(Token) error) (res Result, err error) {
	defer func() { o.aborts.record(ctx, err) }()
	if req.StartOffset < 0 || req.MaxTokens < req.StartOffset {
		return Result{}, fmt.Errorf("engine: openai: bad token range [%d, %d)", req.StartOffset, req.MaxTokens)
	}
	budget := req.MaxTokens - req.StartOffset
	if budget == 0 {
		return Result{FinishReason: FinishLength}, nil
	}
	o.active.Add(1)
	defer o.active.Add(-1)

	path, body, err := buildUpstream(req, o.cfg.Model, budget, o.Capabilities())
	if err != nil {
		return Result{}, err
	}
	hctx, hcancel := context.WithCancelCause(ctx)
	defer hcancel(nil)
	firstToken := time.AfterFunc(o.cfg.FirstTokenTimeout, func() { hcancel(errFirstToken) })
	defer firstToken.Stop()
	failed := func(err error) error {
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(context.Cause(hctx), errFirstToken):
			return &UpstreamError{Message: fmt.Sprintf("no first token within %v (POST %s)", o.cfg.FirstTokenTimeout, path)}
		}
		var ue *UpstreamError
		if errors.As(err, &ue) {
			return ue
		}
		return &UpstreamError{Message: fmt.Sprintf("POST %s: %v", path, err)}
	}

	resp, err := o.post(hctx, path, body, true)
	if err != nil {
		return Result{}, failed(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return Result{}, failed(upstreamStatusError(resp.StatusCode, resp.Header, msg))
	}
	s := &streamReader{budget: budget, emit: emit, ctx: ctx, first: func() { firstToken.Stop() }}
	if req.StartOffset == 0 {
		s.maxPrompt = req.MaxPromptTokens // a continuation's prompt ids include the generated ones
	}
	res, err = s.read(resp.Body)
	var ee emitError
	switch {
	case errors.As(err, &ee):
		return Result{}, ee.err // the worker's own error, as it was
	case err != nil:
		return Result{}, failed(err)
	}
	return res, nil
}

// post sends body to path on the server.
func (o *OpenAI) post(ctx context.Context, path string, body []byte, stream bool) (*http.Response, error) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, o.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/json")
	if stream {
		hr.Header.Set("Accept", "text/event-stream")
	}
	if o.cfg.APIKey != "" {
		hr.Header.Set("Authorization", "Bearer "+o.cfg.APIKey)
	}
	return o.client.Do(hr)
}

// Stats reports the requests running; the server's KV cache is not visible
// through the OpenAI API, so its fields are 0.
func (o *OpenAI) Stats() Stats {
	s := Stats{ActiveRequests: int(o.active.Load())}
	s.Aborted, s.LastAbort = o.aborts.read()
	return s
}
