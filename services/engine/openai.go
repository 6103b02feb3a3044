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
	"sync/atomic"
	"time"
)

// OpenAIConfig points the OpenAI engine at an OpenAI-compatible server.
type OpenAIConfig struct {
	// URL is the server's base URL, such as http://127.0.0.1:8000 (a
	// trailing /v1 is accepted too). Required.
	URL string
	// Model is the model name sent to the server. Required.
	Model string
	// APIKey, if set, is sent as a bearer token.
	APIKey string
	// Client makes the requests; default: an http.Client without an overall
	// timeout (streams are long) on a transport with connect and
	// response-header timeouts.
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
	return errors.Join(errs...)
}

// OpenAI runs requests on an OpenAI-compatible server (vLLM, SGLang,
// llama.cpp, Ollama) through its streaming completions API: the prompt is
// the request's prompt followed by the text generated so far, so a migrated
// request continues where it stopped. Each streamed text chunk is split into
// tokens at word boundaries, whitespace kept with the word that follows it,
// so that the tokens concatenate to exactly the server's text. It is safe for
// concurrent use.
type OpenAI struct {
	cfg      OpenAIConfig
	endpoint string
	client   *http.Client
	active   atomic.Int64
}

// NewOpenAI returns an engine for the server cfg names. It does not contact
// the server.
func NewOpenAI(cfg OpenAIConfig) (*OpenAI, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("engine: openai config: %w", err)
	}
	base := strings.TrimSuffix(strings.TrimSuffix(cfg.URL, "/"), "/v1")
	c := cfg.Client
	if c == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
		t.ResponseHeaderTimeout = 5 * time.Minute // a busy server may queue before answering
		t.MaxIdleConnsPerHost = 64
		c = &http.Client{Transport: t}
	}
	return &OpenAI{cfg: cfg, endpoint: base + "/v1/completions", client: c}, nil
}

// completionRequest is the body of POST /v1/completions.
type completionRequest struct {
	Model     string `json:"model"`
	Prompt    string `json:"prompt"`
	MaxTokens int    `json:"max_tokens"`
	Stream    bool   `json:"stream"`
}

// completionChunk is one streamed event of /v1/completions.
type completionChunk struct {
	Choices []struct {
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// Generate streams req's continuation from the server. It asks for
// MaxTokens-StartOffset tokens and emits each streamed text event as one
// token, at most that many (a server that sends more is cut, with
// FinishLength).
// It returns FinishLength or FinishStop, ctx's error when cancelled, or an
// error describing a failed or malformed response; it never returns
// ErrFatal, since a server can come back.
func (o *OpenAI) Generate(ctx context.Context, req Request, emit func(token string) error) (string, error) {
	if req.StartOffset < 0 || req.MaxTokens < req.StartOffset {
		return "", fmt.Errorf("engine: openai: bad token range [%d, %d)", req.StartOffset, req.MaxTokens)
	}
	budget := req.MaxTokens - req.StartOffset
	if budget == 0 {
		return FinishLength, nil
	}
	o.active.Add(1)
	defer o.active.Add(-1)

	body, err := json.Marshal(completionRequest{Model: o.cfg.Model, Prompt: req.Prompt + req.Generated, MaxTokens: budget, Stream: true})
	if err != nil {
		return "", fmt.Errorf("engine: openai: encode request: %w", err)
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, o.endpoint, bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("engine: openai: %w", err)
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Accept", "text/event-stream")
	if o.cfg.APIKey != "" {
		hr.Header.Set("Authorization", "Bearer "+o.cfg.APIKey)
	}
	resp, err := o.client.Do(hr)
	if err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return "", fmt.Errorf("engine: openai: POST %s: %w", o.endpoint, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return "", fmt.Errorf("engine: openai: POST %s: %s: %s", o.endpoint, resp.Status, strings.TrimSpace(string(msg)))
	}

	emitted := 0
	finish, done := "", false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data:")
		if !ok {
			continue // comments, event names, blank separators
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			done = true
			break
		}
		var c completionChunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return "", fmt.Errorf("engine: openai: malformed stream event %.80q: %w", data, err)
		}
		if c.Error != nil {
			return "", fmt.Errorf("engine: openai: server error: %s", c.Error.Message)
		}
		for _, ch := range c.Choices {
			// OpenAI-compatible servers (vLLM, SGLang, llama.cpp, Ollama)
			// stream one token per event: each non-empty text is a token, so
			// counts and offsets follow the server's tokenizer.
			if ch.Text != "" {
				if emitted == budget {
					return FinishLength, nil
				}
				if err := ctx.Err(); err != nil {
					return "", err // nothing more once cancelled, even if buffered
				}
				if err := emit(ch.Text); err != nil {
					return "", err
				}
				emitted++
			}
			if ch.FinishReason != nil && *ch.FinishReason != "" {
				finish = *ch.FinishReason
			}
		}
	}
	if err := sc.Err(); err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return "", fmt.Errorf("engine: openai: read stream: %w", err)
	}
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	switch {
	case finish == "length" || emitted == budget:
		return FinishLength, nil
	case finish == "" && !done:
		return "", errors.New("engine: openai: stream ended without a finish reason or [DONE]")
	default:
		return FinishStop, nil
	}
}

// Stats reports the requests running; the server's KV cache is not visible
// through the OpenAI API, so its fields are 0.
func (o *OpenAI) Stats() Stats { return Stats{ActiveRequests: int(o.active.Load())} }
