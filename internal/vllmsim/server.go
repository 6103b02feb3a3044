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
