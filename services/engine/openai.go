package engine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
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

	"github.com/baton-dev/baton/events"
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

// streamChunk is one streamed event of /v1/chat/completions or
// /v1/completions, with vLLM's token-id extensions.
type streamChunk struct {
	Model          string         `json:"model"`
	Choices        []streamChoice `json:"choices"`
	PromptTokenIDs []int          `json:"prompt_token_ids"`
	Usage          *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// streamChoice is one choice of a streamChunk: a completion's text or a
// chat's delta.
type streamChoice struct {
	Text  *string `json:"text"`
	Delta *struct {
		Content          *string         `json:"content"`
		ReasoningContent *string         `json:"reasoning_content"`
		Reasoning        *string         `json:"reasoning"`
		Refusal          *string         `json:"refusal"`
		ToolCalls        json.RawMessage `json:"tool_calls"`
	} `json:"delta"`
	Logprobs       json.RawMessage `json:"logprobs"`
	FinishReason   *string         `json:"finish_reason"`
	TokenIDs       []int           `json:"token_ids"`
	PromptTokenIDs []int           `json:"prompt_token_ids"`
}

// token is the text of the choice and its Details as JSON, nil when it
// carries nothing beyond its text.
func (ch *streamChoice) token() (string, json.RawMessage) {
	var text string
	var d Details
	if ch.Text != nil {
		text = *ch.Text
	}
	if ch.Delta != nil {
		if ch.Delta.Content != nil {
			text = *ch.Delta.Content
		}
		if r := ch.Delta.ReasoningContent; r != nil {
			d.ReasoningContent = *r
		} else if r := ch.Delta.Reasoning; r != nil {
			d.ReasoningContent = *r
		}
		if ch.Delta.Refusal != nil {
			d.Refusal = *ch.Delta.Refusal
		}
		if present(ch.Delta.ToolCalls) {
			d.ToolCalls = ch.Delta.ToolCalls
		}
	}
	if present(ch.Logprobs) {
		d.Logprobs = ch.Logprobs
	}
	var details json.RawMessage
	if d.ToolCalls != nil || d.Logprobs != nil || d.ReasoningContent != "" || d.Refusal != "" {
		details, _ = json.Marshal(d)
	}
	return text, details
}

// Details is what a token carries beyond its text, as the server sent it:
// the chunk's tool_calls delta, logprobs, reasoning and refusal. It is the
// JSON of Token.Details.
type Details struct {
	ToolCalls        json.RawMessage `json:"tool_calls,omitempty"`
	Logprobs         json.RawMessage `json:"logprobs,omitempty"`
	ReasoningContent string          `json:"reasoning_content,omitempty"`
	Refusal          string          `json:"refusal,omitempty"`
}

func present(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// streamReader turns a server's event stream into tokens.
type streamReader struct {
	ctx     context.Context
	budget  int
	emit    func(Token) error
	first   func() // called once, at the first token
	emitted int
	prompt  []int  // prompt ids, to put on the first token
	model   string // the server's model name, to put on the first token
	// maxPrompt, if positive, is the prompt limit checked on the server's
	// prompt ids.
	maxPrompt int
}

func (s *streamReader) token(t Token) (full bool, err error) {
	if s.emitted == s.budget {
		return true, nil
	}
	if err := s.ctx.Err(); err != nil {
		return false, err // nothing more once cancelled, even if buffered
	}
	if s.emitted == 0 {
		s.first()
		t.PromptIDs, t.Model = s.prompt, s.model
	}
	if err := s.emit(t); err != nil {
		return false, emitError{err}
	}
	s.emitted++
	return false, nil
}

// checkPrompt fails a prompt longer than the limit in the server's tokens.
func (s *streamReader) checkPrompt() error {
	if s.maxPrompt > 0 && len(s.prompt) > s.maxPrompt {
		return &UpstreamError{Class: events.FailureClient, Status: http.StatusRequestEntityTooLarge, Code: "prompt_too_large",
			Message: fmt.Sprintf("the prompt is %d tokens (the model server's count), more than the limit of %d", len(s.prompt), s.maxPrompt)}
	}
	return nil
}

// emitError is an error returned by emit.
type emitError struct{ err error }

func (e emitError) Error() string { return e.err.Error() }

// read consumes the stream. A chunk that is not JSON, an error event, and a
// stream that ends with neither a finish reason nor [DONE] are failures.
func (s *streamReader) read(body io.Reader) (Result, error) {
	var res Result
	done := false
	var said string // the last line that was not an event's data: a server's words outside the protocol
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 4096), 4*1024*1024)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data:")
		if !ok {
			said = outsideWords(sc.Text(), said)
			continue // comments, event names, blank separators
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			done = true
			break
		}
		var c streamChunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return res, &UpstreamError{Message: fmt.Sprintf("malformed stream event %.80q: %v", data, err)}
		}
		if present(c.Error) {
			return res, streamError(c.Error)
		}
		full, err := s.chunk(&c, &res)
		if err != nil {
			return res, err
		}
		if full {
			res.FinishReason = FinishLength
			return res, nil
		}
	}
	if err := sc.Err(); err != nil {
		return res, &UpstreamError{Message: fmt.Sprintf("read stream: %v", err)}
	}
	if err := s.ctx.Err(); err != nil {
		return res, err
	}
	switch {
	case res.FinishReason == "" && !done && s.emitted == 0:
		return res, emptyAnswer(said)
	case res.FinishReason == "" && !done:
		return res, &UpstreamError{Message: "stream ended without a finish reason or [DONE]"}
	case res.FinishReason == "" && s.emitted == s.budget:
		res.FinishReason = FinishLength
	case res.FinishReason == "":
		res.FinishReason = FinishStop
	}
	return res, nil
}

// outsideWords keeps line as what the server said outside the stream's
// events, unless it is one of the protocol's own lines (blank, a comment,
// an event name, an id, a retry); said is what it kept before.
func outsideWords(line, said string) string {
	line = strings.TrimSpace(line)
	if line == "" || strings.HasPrefix(line, ":") {
		return said
	}
	for _, field := range []string{"event:", "id:", "retry:"} {
		if strings.HasPrefix(line, field) {
			return said
		}
	}
	return line
}

// emptyAnswer is the failure of a stream that ended before its first token
// with neither a finish reason nor [DONE]. A server that said something
// outside the events (where a request-caused failure may put it) is
// quoted; an error object there is read as an error event in the stream.
func emptyAnswer(said string) *UpstreamError {
	const msg = "the stream ended before the first token, without a finish reason or [DONE]"
	if said == "" {
		return &UpstreamError{Code: events.CodeEmptyAnswer, Message: msg}
	}
	if rest, ok := strings.CutPrefix(said, "error:"); ok {
		said = strings.TrimSpace(rest)
	}
	var obj struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal([]byte(said), &obj) == nil && present(obj.Error) {
		return streamError(obj.Error) // as an error event in the stream
	}
	const most = 300
	if len(said) > most {
		said = said[:most] + "…"
	}
	return &UpstreamError{Code: events.CodeEmptyAnswer, Message: fmt.Sprintf("%s; the server said: %s", msg, said)}
}

// chunk takes in one event of the stream: its usage and prompt token ids
// into res and s, its choices' tokens through emitChoice, their finish reason
// into res. It reports whether the token budget is full.
func (s *streamReader) chunk(c *streamChunk, res *Result) (full bool, err error) {
	if c.Usage != nil {
		res.PromptTokens, res.CompletionTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
	}
	if c.PromptTokenIDs != nil {
		s.prompt = c.PromptTokenIDs
	}
	if s.model == "" {
		s.model = c.Model
	}
	if err := s.checkPrompt(); err != nil {
		return false, err
	}
	for _, ch := range c.Choices {
		if ch.PromptTokenIDs != nil {
			s.prompt = ch.PromptTokenIDs
			if err := s.checkPrompt(); err != nil {
				return false, err
			}
		}
		text, details := ch.token()
		full, err := s.emitChoice(text, details, ch.TokenIDs)
		if err != nil || full {
			return full, err
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			res.FinishReason = *ch.FinishReason
		}
	}
	return false, nil
}

// emitChoice emits one streamed choice: one token per token id when the
// server sent ids (the text and details ride on the first), else one token
// if it has text or details. full reports that the budget was reached
// before all of it was emitted.
func (s *streamReader) emitChoice(text string, details json.RawMessage, ids []int) (full bool, err error) {
	if len(ids) == 0 {
		if text == "" && details == nil {
			return false, nil
		}
		return s.token(Token{Text: text, Details: details})
	}
	for i, id := range ids {
		t := Token{ID: id, HasID: true}
		if i == 0 {
			t.Text, t.Details = text, details
		}
		if full, err := s.token(t); full || err != nil {
			return full, err
		}
	}
	return false, nil
}

// streamError is an error event in a stream: a failure after the response
// began, classified by its code when that is an HTTP status.
func streamError(raw json.RawMessage) *UpstreamError {
	e := &UpstreamError{}
	var inner struct {
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"`
	}
	if json.Unmarshal(raw, &inner) != nil {
		_ = json.Unmarshal(raw, &inner.Message)
	}
	var status int
	if json.Unmarshal(inner.Code, &status) == nil && status >= 400 {
		e.Status = status
		e.Class = ClassOf(status)
	}
	e.Code, e.Message = codeString(inner.Code, inner.Type), inner.Message
	if e.Message == "" {
		e.Message = "error event: " + string(raw)
	}
	if e.Class == "" && e.Code == "content_policy_violation" {
		e.Class = events.FailureClient
	}
	return e
}
