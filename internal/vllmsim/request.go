package vllmsim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

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
