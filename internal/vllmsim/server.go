package vllmsim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Config configures a simulator. Zero values mean the documented defaults.
type Config struct {
	// Model is the served model name (default "sim").
	Model string
	// MaxModelLen bounds prompt + completion tokens (default 4096).
	MaxModelLen int
	// TTFT is the delay before the first token; TokenDelay the delay before
	// each later one.
	TTFT, TokenDelay time.Duration
	// APIKey, when set, is required as a bearer token on /v1 (else 401).
	APIKey string
	// ChatOnly serves no /v1/completions (404, as a server without it).
	ChatOnly bool
	// RejectPrefill answers 400 to continue_final_message.
	RejectPrefill bool
	// Greedy makes temperature 0 the default, as vLLM does with
	// --override-generation-config '{"temperature": 0}' (vLLM's own default
	// is 1: unseeded requests without a temperature sample at random).
	Greedy bool
	// NoTokenIDs is a server without token ids: return_token_ids is
	// ignored and a prompt of token ids is rejected (400).
	NoTokenIDs bool
	// Fault, if set, applies to the first FaultRequests generation requests
	// (0: to all of them). A request's X-Vllmsim-Fault header overrides it.
	Fault         *Fault
	FaultRequests int
	// FaultMatch, if set, limits Fault to requests whose body contains it
	// (FaultRequests counts only those), so that a client's probes or other
	// requests are not affected.
	FaultMatch string
	// ListedModel, if set, is the name GET /v1/models lists instead of
	// Model, as servers whose listing differs from the name they serve do
	// (Ollama lists "tiny:latest" and serves "tiny"). Requests may name
	// either.
	ListedModel string
	// Slots, if positive, is how many generations run at once, as an
	// engine's parallel slots: the others wait in a queue, in arrival
	// order, and send nothing (not even response headers) until a slot
	// frees. A client that goes away leaves the queue.
	Slots int
	// TemplatedCompletions wraps a /v1/completions text prompt in the chat
	// template as one user message, as Ollama does: the prompt plus a
	// partial answer is then a new question, not a continuation.
	TemplatedCompletions bool
	// IgnorePrefill accepts continue_final_message but ignores it: the
	// template opens a new assistant turn after the final assistant
	// message, as a server whose chat template knows no prefill does.
	IgnorePrefill bool
	// RetokenizePrefill, if positive, re-tokenizes a prefilled assistant
	// message (continue_final_message) of at least this many tokens into
	// other ids than the model generated, as Ollama does: it renders the
	// messages to text and tokenizes them anew, and the ids its model
	// generates are not always the canonical encoding of their text.
	// Measured on Ollama v0.6.5 and v0.17.4 (issue 35): prefilling the
	// first K tokens of a greedy answer continued it exactly for K <= 50
	// and diverged from K = 100 on, and the continuation's prompt_tokens
	// were 137 for a 33-token prompt plus 100 generated. Here every
	// " word" of such a message becomes two tokens (" " and "word"): the
	// prompt is longer than prompt + generated, and the text after the
	// cut differs from the uninterrupted answer. Shorter prefills (the
	// probe's) are tokenized as usual.
	RetokenizePrefill int
}

func (c Config) withDefaults() Config {
	if c.Model == "" {
		c.Model = "sim"
	}
	if c.MaxModelLen <= 0 {
		c.MaxModelLen = 4096
	}
	return c
}

// BodyFault scripts a fault from inside a request body, as the vendor field
// "vllmsim_fault": {"spec": "500@3", "key": "k", "times": 1}. It travels
// wherever the body does (through a proxy that passes unknown fields on), and
// applies to the first Times requests (default 1) carrying the same spec and
// key: a retry or a continuation of the request elsewhere then succeeds.
type BodyFault struct {
	Spec  string `json:"spec"`
	Key   string `json:"key"`
	Times int    `json:"times"`
}

// Record is a request the simulator received.
type Record struct {
	Path  string          `json:"path"`
	Fault string          `json:"fault,omitempty"` // the fault applied, as a spec
	Body  json.RawMessage `json:"body"`
}

// Server is a simulated vLLM server. It is safe for concurrent use.
type Server struct {
	cfg Config
	mux *http.ServeMux

	mu      sync.Mutex
	records []Record
	served  int // requests Config.Fault applied to or would have, for Config.FaultRequests
	// bodyFaults counts the requests seen per BodyFault spec and key.
	bodyFaults map[string]int
	rng        *rand.Rand
	gens       generations
	slots      chan struct{} // Config.Slots; nil: no queue
}

// Status is what GET /sim/status says about the generations: how many run,
// and how many were aborted because their client went away before the
// answer ended (LastAbort: when the latest of them let go of the server).
type Status struct {
	Running int `json:"running"`
	// Queued counts the generations waiting for a slot (Config.Slots).
	Queued    int       `json:"queued"`
	Aborted   int64     `json:"aborted"`
	LastAbort time.Time `json:"last_abort"`
}

// generations counts running and aborted generations.
type generations struct {
	mu sync.Mutex
	st Status
}

func (g *generations) begin() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.st.Running++
}

// end counts a generation's end: an abort when its client is gone (ctx
// done) before the handler returned.
func (g *generations) end(ctx context.Context) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.st.Running--
	if ctx.Err() != nil {
		g.st.Aborted++
		g.st.LastAbort = time.Now()
	}
}

// Status returns the generation counts.
func (s *Server) Status() Status {
	s.gens.mu.Lock()
	defer s.gens.mu.Unlock()
	return s.gens.st
}

// metrics serves GET /metrics in Prometheus's text format: vLLM's
// vllm:num_requests_running and the simulator's own abort counter.
func (s *Server) metrics(w http.ResponseWriter, _ *http.Request) {
	st := s.Status()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	fmt.Fprintf(w, "# HELP vllm:num_requests_running Number of requests running.\n# TYPE vllm:num_requests_running gauge\n")
	fmt.Fprintf(w, "vllm:num_requests_running{model_name=%q} %d\n", s.cfg.Model, st.Running)
	fmt.Fprintf(w, "# HELP vllmsim_requests_aborted_total Generations aborted because the client went away before the answer ended.\n# TYPE vllmsim_requests_aborted_total counter\n")
	fmt.Fprintf(w, "vllmsim_requests_aborted_total{model_name=%q} %d\n", s.cfg.Model, st.Aborted)
}

// New returns a simulator for cfg.
func New(cfg Config) *Server {
	s := &Server{cfg: cfg.withDefaults(), mux: http.NewServeMux(), rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())), bodyFaults: map[string]int{}}
	if s.cfg.Slots > 0 {
		s.slots = make(chan struct{}, s.cfg.Slots)
	}
	s.mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, true) })
	s.mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, false) })
	s.mux.HandleFunc("GET /v1/models", s.models)
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	s.mux.HandleFunc("POST /tokenize", s.tokenize)
	s.mux.HandleFunc("POST /detokenize", s.detokenize)
	s.mux.HandleFunc("GET /sim/requests", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, s.Records()) })
	s.mux.HandleFunc("GET /sim/status", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, s.Status()) })
	s.mux.HandleFunc("GET /metrics", s.metrics)
	s.mux.HandleFunc("DELETE /sim/requests", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.records = nil
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	return s
}

// ServeHTTP serves the simulator's API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Records returns a copy of the generation requests received so far (the
// last 2048 to 4096 of them).
func (s *Server) Records() []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Record(nil), s.records...)
}

// apiError is an error answered in vLLM's shape.
type apiError struct {
	status     int
	typ        string
	code       string // OpenAI-style code, when not the status
	message    string
	retryAfter int
}

func (e *apiError) Error() string { return e.message }

func errorf(status int, typ, format string, args ...any) *apiError {
	return &apiError{status: status, typ: typ, message: fmt.Sprintf(format, args...)}
}

func (e *apiError) body() map[string]any {
	var code any = e.status
	if e.code != "" {
		code = e.code
	}
	return map[string]any{"error": map[string]any{"message": e.message, "type": e.typ, "param": nil, "code": code}}
}

func writeErr(w http.ResponseWriter, err error) {
	var e *apiError
	if !errors.As(err, &e) {
		e = errorf(http.StatusInternalServerError, "InternalServerError", "%v", err)
	}
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(e.retryAfter))
	}
	writeJSON(w, e.status, e.body())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) authorized(r *http.Request) bool {
	return s.cfg.APIKey == "" || r.Header.Get("Authorization") == "Bearer "+s.cfg.APIKey
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) {
		writeJSON(w, http.StatusUnauthorized, map[string]any{"error": "Unauthorized"})
		return
	}
	listed := s.cfg.Model
	if s.cfg.ListedModel != "" {
		listed = s.cfg.ListedModel
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []map[string]any{{
		"id": listed, "object": "model", "created": 0, "owned_by": "vllm", "root": s.cfg.Model, "max_model_len": s.cfg.MaxModelLen,
	}}})
}

func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model                string          `json:"model"`
		Prompt               *string         `json:"prompt"`
		Messages             []ChatMessage   `json:"messages"`
		Tools                json.RawMessage `json:"tools"`
		AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
		ContinueFinalMessage bool            `json:"continue_final_message"`
		ReturnTokenStrs      bool            `json:"return_token_strs"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeErr(w, errorf(400, "BadRequestError", "invalid JSON: %v", err))
		return
	}
	if req.Model != "" && !s.serves(req.Model) {
		writeErr(w, errorf(404, "NotFoundError", "The model `%s` does not exist.", req.Model))
		return
	}
	text := ""
	switch {
	case req.Prompt != nil:
		text = *req.Prompt
	case req.Messages != nil:
		var err error
		if text, err = ApplyChatTemplate(req.Messages, req.Tools, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt, req.ContinueFinalMessage); err != nil {
			writeErr(w, err)
			return
		}
	default:
		writeErr(w, errorf(400, "BadRequestError", "either prompt or messages is required"))
		return
	}
	ids := Tokenize(text)
	out := map[string]any{"count": len(ids), "max_model_len": s.cfg.MaxModelLen, "tokens": ids}
	if req.ReturnTokenStrs {
		strs := make([]string, len(ids))
		for i, id := range ids {
			strs[i] = tokenText(id)
		}
		out["token_strs"] = strs
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) detokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model  string `json:"model"`
		Tokens []int  `json:"tokens"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeErr(w, errorf(400, "BadRequestError", "invalid JSON: %v", err))
		return
	}
	text, ok := Detokenize(req.Tokens)
	if !ok {
		writeErr(w, errorf(400, "BadRequestError", "token id out of range [0, %d)", VocabSize))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"prompt": text})
}

// genRequest is what the simulator reads of a chat or completion request;
// other fields are accepted and ignored, as vLLM does.
type genRequest struct {
	Model               string          `json:"model"`
	Messages            []ChatMessage   `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Temperature          *float64        `json:"temperature"`
	Seed                 *int64          `json:"seed"`
	Stop                 json.RawMessage `json:"stop"`
	N                    *int            `json:"n"`
	Logprobs             json.RawMessage `json:"logprobs"` // chat: bool; completions: int
	TopLogprobs          int             `json:"top_logprobs"`
	Tools                json.RawMessage `json:"tools"`
	ToolChoice           json.RawMessage `json:"tool_choice"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	ReturnTokenIDs       bool            `json:"return_token_ids"`
}

// fault picks the fault for one generation request and counts it.
func (s *Server) fault(r *http.Request, body []byte) (*Fault, error) {
	if h := r.Header.Get(FaultHeader); h != "" {
		return ParseFault(h)
	}
	var scripted struct {
		F *BodyFault `json:"vllmsim_fault"`
	}
	if json.Unmarshal(body, &scripted) == nil && scripted.F != nil {
		key := scripted.F.Spec + "#" + scripted.F.Key
		s.mu.Lock()
		s.bodyFaults[key]++
		n := s.bodyFaults[key]
		s.mu.Unlock()
		if n > max(scripted.F.Times, 1) {
			return nil, nil
		}
		return ParseFault(scripted.F.Spec)
	}
	if s.cfg.Fault == nil || (s.cfg.FaultMatch != "" && !bytes.Contains(body, []byte(s.cfg.FaultMatch))) {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.served++
	if s.cfg.FaultRequests <= 0 || s.served <= s.cfg.FaultRequests {
		return s.cfg.Fault, nil
	}
	return nil, nil
}

func (s *Server) record(path string, body []byte, f *Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := json.RawMessage(body)
	if !json.Valid(body) {
		b, _ = json.Marshal(string(body))
	}
	if len(s.records) == maxRecords {
		s.records = append(s.records[:0], s.records[maxRecords/2:]...) // keep the newer half
	}
	s.records = append(s.records, Record{Path: path, Fault: f.String(), Body: b})
}

// maxRecords bounds the requests kept for GET /sim/requests: a soak or a
// try-out stack runs for long.
const maxRecords = 4096

func (s *Server) generate(w http.ResponseWriter, r *http.Request, chat bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	if err != nil {
		writeErr(w, errorf(400, "BadRequestError", "read body: %v", err))
		return
	}
	if !chat && s.cfg.ChatOnly {
		s.record(r.URL.Path, body, nil)
		writeJSON(w, http.StatusNotFound, map[string]any{"detail": "Not Found"})
		return
	}
	f, ferr := s.fault(r, body)
	s.record(r.URL.Path, body, f)
	if ferr != nil {
		writeErr(w, errorf(400, "BadRequestError", "%v", ferr))
		return
	}
	if !s.authorized(r) {
		writeJSON(w, http.StatusUnauthorized, map[string]any{"error": "Unauthorized"})
		return
	}
	g, err := s.prepare(body, chat, f)
	if err != nil {
		writeErr(w, err)
		return
	}
	if f != nil && f.Kind == FaultStatus && f.After == 0 {
		writeErr(w, statusFault(f))
		return
	}
	if !s.acquireSlot(r.Context()) {
		return // the client left the queue
	}
	defer s.releaseSlot()
	s.gens.begin()
	defer s.gens.end(r.Context())
	if g.req.Stream {
		s.stream(w, r, g, f)
	} else {
		s.unary(w, r, g, f)
	}
}

func statusFault(f *Fault) *apiError {
	typ := "InternalServerError"
	switch f.Status {
	case 429:
		typ = "TooManyRequests"
	case 503:
		typ = "ServiceUnavailable"
	case 400:
		typ = "BadRequestError"
	}
	e := errorf(f.Status, typ, "simulated %d after %d tokens", f.Status, f.After)
	e.retryAfter = f.RetryAfter
	return e
}

// serves reports whether a request may name model.
func (s *Server) serves(model string) bool {
	return model == s.cfg.Model || (s.cfg.ListedModel != "" && model == s.cfg.ListedModel)
}

// acquireSlot waits for a free slot (Config.Slots), sending nothing; it
// reports false when ctx ended first.
func (s *Server) acquireSlot(ctx context.Context) bool {
	if s.slots == nil {
		return true
	}
	select {
	case s.slots <- struct{}{}:
		return true
	default:
	}
	s.gens.mu.Lock()
	s.gens.st.Queued++
	s.gens.mu.Unlock()
	defer func() {
		s.gens.mu.Lock()
		s.gens.st.Queued--
		s.gens.mu.Unlock()
	}()
	select {
	case s.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (s *Server) releaseSlot() {
	if s.slots != nil {
		<-s.slots
	}
}

// generation is a validated request, ready to run.
type generation struct {
	req       genRequest
	chat      bool
	prompt    []int
	maxTokens int
	sampling  sampling
	stops     []string
	logprobs  bool
	top       int    // top logprobs per token
	tool      string // the function called, in tool mode
	created   int64
	id        string
}

func (s *Server) prepare(body []byte, chat bool, f *Fault) (*generation, error) {
	g := &generation{chat: chat, created: time.Now().Unix()}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&g.req); err != nil {
		return nil, errorf(400, "BadRequestError", "invalid request: %v", err)
	}
	req := &g.req
	if !s.serves(req.Model) {
		return nil, errorf(404, "NotFoundError", "The model `%s` does not exist.", req.Model)
	}
	if req.N != nil && *req.N != 1 {
		return nil, errorf(400, "BadRequestError", "the simulator supports n=1 only, got %d", *req.N)
	}
	if req.ContinueFinalMessage && s.cfg.RejectPrefill {
		return nil, errorf(400, "BadRequestError", "continue_final_message is not supported by this server")
	}
	if s.cfg.NoTokenIDs {
		req.ReturnTokenIDs = false
	}
	if err := s.setPrompt(g); err != nil {
		return nil, err
	}
	if f != nil && f.Kind == FaultPolicy {
		return nil, &apiError{status: 400, typ: "invalid_request_error", code: "content_policy_violation",
			message: "Your request was rejected as a result of the simulated safety system."}
	}
	g.maxTokens = 16
	if chat {
		g.maxTokens = s.cfg.MaxModelLen - len(g.prompt)
	}
	for _, v := range []*int{req.MaxTokens, req.MaxCompletionTokens} {
		if v != nil {
			if *v < 1 {
				return nil, errorf(400, "BadRequestError", "max_tokens must be at least 1, got %d", *v)
			}
			g.maxTokens = *v
		}
	}
	if len(g.prompt)+g.maxTokens > s.cfg.MaxModelLen || (f != nil && f.Kind == FaultContext) {
		return nil, errorf(400, "BadRequestError", "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			s.cfg.MaxModelLen, len(g.prompt)+g.maxTokens, len(g.prompt), g.maxTokens)
	}
	if err := s.setSampling(g); err != nil {
		return nil, err
	}
	stops, err := parseStop(req.Stop)
	if err != nil {
		return nil, err
	}
	g.stops = stops
	if err := g.parseLogprobs(); err != nil {
		return nil, err
	}
	if chat {
		g.tool = toolName(req.Tools, req.ToolChoice)
	}
	g.id = fmt.Sprintf("%016x", uint64(newContext(g.prompt))^uint64(time.Now().UnixNano()))
	return g, nil
}

// setPrompt tokenizes g's prompt: a chat's messages through the chat
// template, or a completion's prompt.
func (s *Server) setPrompt(g *generation) error {
	req := &g.req
	if !g.chat && s.cfg.TemplatedCompletions {
		var text string
		if json.Unmarshal(req.Prompt, &text) != nil {
			return errorf(400, "BadRequestError", "prompt must be a string")
		}
		content, _ := json.Marshal(text)
		tmpl, err := ApplyChatTemplate([]ChatMessage{{Role: "user", Content: content}}, nil, true, false)
		if err != nil {
			return err
		}
		g.prompt = Tokenize(tmpl)
		return nil
	}
	if !g.chat {
		ids, err := s.completionPrompt(req.Prompt)
		if err != nil {
			return err
		}
		g.prompt = ids
		return nil
	}
	if req.Messages == nil {
		return errorf(400, "BadRequestError", "messages: field required")
	}
	gen, cont := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt, req.ContinueFinalMessage
	if s.cfg.IgnorePrefill {
		gen, cont = true, false
	}
	text, err := ApplyChatTemplate(req.Messages, req.Tools, gen, cont)
	if err != nil {
		return err
	}
	g.prompt = Tokenize(text)
	if cont && s.cfg.RetokenizePrefill > 0 {
		g.prompt = retokenizePrefill(text, req.Messages[len(req.Messages)-1], s.cfg.RetokenizePrefill)
	}
	return nil
}

// retokenizePrefill is the prompt of text, whose end is the content of
// final, an assistant message left open, with that content tokenized as a
// server that re-tokenizes prefill does (Config.RetokenizePrefill): each
// " word" token as two, when the content is at least min tokens long.
func retokenizePrefill(text string, final ChatMessage, min int) []int {
	content, _ := contentText(final.Content)
	prefix, ok := strings.CutSuffix(text, content)
	ids := Tokenize(content)
	if !ok || len(ids) < min {
		return Tokenize(text)
	}
	out := Tokenize(prefix)
	for _, id := range ids {
		if id >= firstWordID+len(words) && id < VocabSize {
			out = append(out, ' ', id-len(words)) // " word" as " " and "word"
			continue
		}
		out = append(out, id)
	}
	return out
}

// setSampling sets g's sampling from its request and the server's config.
// Random sampling with no seed gets its own generator, seeded from the
// server's.
func (s *Server) setSampling(g *generation) error {
	req := &g.req
	g.sampling = sampling{temperature: 1, seed: req.Seed, rng: s.rng}
	if s.cfg.Greedy {
		g.sampling.temperature = 0
	}
	if req.Temperature != nil {
		if *req.Temperature < 0 {
			return errorf(400, "BadRequestError", "temperature must be non-negative, got %v", *req.Temperature)
		}
		g.sampling.temperature = *req.Temperature
	}
	if g.sampling.temperature > 0 && req.Seed == nil {
		s.mu.Lock() // rand.Rand is not safe for concurrent use: give each request its own
		g.sampling.rng = rand.New(rand.NewPCG(s.rng.Uint64(), s.rng.Uint64()))
		s.mu.Unlock()
	}
	return nil
}

func (s *Server) completionPrompt(raw json.RawMessage) ([]int, error) {
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return Tokenize(text), nil
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil && len(texts) == 1 {
		return Tokenize(texts[0]), nil
	}
	var ids []int
	if json.Unmarshal(raw, &ids) != nil {
		var nested [][]int
		if json.Unmarshal(raw, &nested) != nil || len(nested) != 1 {
			return nil, errorf(400, "BadRequestError", "prompt must be a string, one string in a list, or a list of token ids")
		}
		ids = nested[0]
	}
	if s.cfg.NoTokenIDs {
		return nil, errorf(400, "BadRequestError", "this server does not accept token-id prompts")
	}
	if len(ids) == 0 {
		return nil, errorf(400, "BadRequestError", "prompt must not be empty")
	}
	if _, ok := Detokenize(ids); !ok {
		return nil, errorf(400, "BadRequestError", "token id out of vocabulary [0, %d)", VocabSize)
	}
	return ids, nil
}

func parseStop(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []string{one}, nil
	}
	var list []string
	if json.Unmarshal(raw, &list) != nil {
		return nil, errorf(400, "BadRequestError", "stop must be a string or a list of strings")
	}
	return list, nil
}

func (g *generation) parseLogprobs() error {
	raw := g.req.Logprobs
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if g.chat {
		var on bool
		if json.Unmarshal(raw, &on) != nil {
			return errorf(400, "BadRequestError", "logprobs must be a boolean")
		}
		g.logprobs, g.top = on, g.req.TopLogprobs
	} else {
		var n int
		if json.Unmarshal(raw, &n) != nil || n < 0 {
			return errorf(400, "BadRequestError", "logprobs must be a non-negative integer")
		}
		g.logprobs, g.top = true, n
	}
	if g.top > candidates {
		return errorf(400, "BadRequestError", "top logprobs is at most %d here, got %d", candidates, g.top)
	}
	return nil
}

// toolName is the function the model calls: the named one of tool_choice,
// else the first tool, unless tool_choice is "none" or there are no tools.
func toolName(tools, choice json.RawMessage) string {
	var list []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(tools, &list) != nil || len(list) == 0 {
		return ""
	}
	var mode string
	if json.Unmarshal(choice, &mode) == nil && mode == "none" {
		return ""
	}
	var named struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(choice, &named) == nil && named.Function.Name != "" {
		return named.Function.Name
	}
	return list[0].Function.Name
}

// stopAt reports where a stop string ends text, if one occurs in it.
func stopAt(text string, stops []string) (int, bool) {
	best, found := len(text), false
	for _, st := range stops {
		if st == "" {
			continue
		}
		if i := strings.Index(text, st); i >= 0 && i < best {
			best, found = i, true
		}
	}
	return best, found
}
