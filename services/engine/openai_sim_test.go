package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/vllmsim"
	"github.com/baton-dev/baton/services/engine"
)

// simEngine starts a simulator for cfg and an OpenAI engine in front of it,
// probed.
func simEngine(t *testing.T, cfg vllmsim.Config, ecfg engine.OpenAIConfig) (*engine.OpenAI, *vllmsim.Server) {
	t.Helper()
	sim := vllmsim.New(cfg)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	ecfg.URL = srv.URL
	if ecfg.Model == "" {
		ecfg.Model = "sim"
	}
	e, err := engine.NewOpenAI(ecfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Probe(t.Context()); err != nil {
		t.Fatalf("probe: %v", err)
	}
	return e, sim
}

func TestOpenAIConformanceOnSimulator(t *testing.T) {
	conformance(t, func(t *testing.T) engine.Engine {
		e, _ := simEngine(t, vllmsim.Config{TokenDelay: time.Millisecond, Greedy: true}, engine.OpenAIConfig{})
		return e
	})
}

// TestOpenAIProbeRetriesWhatItCouldNotLearn: an overloaded answer says
// nothing about a feature, so the probe fails (to be tried again) rather
// than record the feature as missing; the next probe finds everything.
func TestOpenAIProbeRetriesWhatItCouldNotLearn(t *testing.T) {
	srv := httptest.NewServer(vllmsim.New(vllmsim.Config{Fault: &vllmsim.Fault{Kind: vllmsim.FaultStatus, Status: 503}, FaultRequests: 2}))
	defer srv.Close()
	e, err := engine.NewOpenAI(engine.OpenAIConfig{URL: srv.URL, Model: "sim"})
	if err != nil {
		t.Fatal(err)
	}
	if caps, err := e.Probe(t.Context()); err == nil {
		t.Fatalf("first probe = %+v, want an error", caps)
	}
	_, _ = e.Probe(t.Context()) // the second 503
	want := engine.Capabilities{Chat: true, Completions: true, TokenIDs: true, Prefill: true}
	if caps, err := e.Probe(t.Context()); err != nil || caps != want {
		t.Fatalf("third probe = %+v, %v; want %+v", caps, err, want)
	}
}

func TestOpenAIProbe(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  vllmsim.Config
		key  string
		want engine.Capabilities
		fail string // expected failure class
	}{
		{name: "vllm", want: engine.Capabilities{Chat: true, Completions: true, TokenIDs: true, Prefill: true}},
		{name: "chat only", cfg: vllmsim.Config{ChatOnly: true}, want: engine.Capabilities{Chat: true, Prefill: true}},
		{name: "no token ids", cfg: vllmsim.Config{NoTokenIDs: true}, want: engine.Capabilities{Chat: true, Completions: true, Prefill: true}},
		{name: "no prefill", cfg: vllmsim.Config{RejectPrefill: true}, want: engine.Capabilities{Chat: true, Completions: true, TokenIDs: true}},
		{name: "bad key", cfg: vllmsim.Config{APIKey: "right"}, key: "wrong", fail: events.FailureNotReady},
		{name: "unknown model", cfg: vllmsim.Config{Model: "other"}, fail: events.FailureNotReady},
		// Issue 22: the listing is advisory; the answers decide.
		{name: "listed with a :latest tag", cfg: vllmsim.Config{ListedModel: "sim:latest"}, want: engine.Capabilities{Chat: true, Completions: true, TokenIDs: true, Prefill: true}},
		{name: "chat-templated completions (Ollama): not continuable by prefill", cfg: vllmsim.Config{TemplatedCompletions: true, NoTokenIDs: true},
			want: engine.Capabilities{Chat: true, Completions: true, Prefill: true, CompletionsNotContinuable: true}},
		{name: "prefill accepted but ignored: no prefill", cfg: vllmsim.Config{IgnorePrefill: true, Greedy: true},
			want: engine.Capabilities{Chat: true, Completions: true, TokenIDs: true}},
		{name: "listed under another name", cfg: vllmsim.Config{ListedModel: "s"}, want: engine.Capabilities{Chat: true, Completions: true, TokenIDs: true, Prefill: true}},
		{name: "overloaded", cfg: vllmsim.Config{Fault: &vllmsim.Fault{Kind: vllmsim.FaultStatus, Status: 503}}, fail: events.FailureUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(vllmsim.New(tc.cfg))
			defer srv.Close()
			e, err := engine.NewOpenAI(engine.OpenAIConfig{URL: srv.URL, Model: "sim", APIKey: tc.key})
			if err != nil {
				t.Fatal(err)
			}
			caps, err := e.Probe(t.Context())
			if tc.fail != "" {
				var ue *engine.UpstreamError
				if !errors.As(err, &ue) || ue.Class != tc.fail {
					t.Fatalf("Probe = %+v, %v; want a %s failure", caps, err, tc.fail)
				}
				return
			}
			if err != nil || caps != tc.want || e.Capabilities() != tc.want {
				t.Fatalf("Probe = %+v, %v; want %+v", caps, err, tc.want)
			}
		})
	}
}

// TestOpenAIPassesTheBodyThrough: every field of the client's body reaches
// the server as sent, vendor extras included; only model, stream,
// stream_options.include_usage, max_tokens and n are rewritten.
func TestOpenAIPassesTheBodyThrough(t *testing.T) {
	e, sim := simEngine(t, vllmsim.Config{}, engine.OpenAIConfig{})
	client := `{"model":"alias","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"weather?"}]}],
		"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
		"tool_choice":"auto","response_format":{"type":"text"},"stop":["\n\n"],"seed":11,"temperature":0.7,"top_p":0.9,"top_k":40,
		"logprobs":true,"top_logprobs":2,"presence_penalty":0.1,"user":"u-1","my_vendor_field":{"x":[1,2]},
		"max_tokens":30,"n":1,"stream":false,"stream_options":{"include_usage":false,"continuous_usage_stats":true}}`
	var toks []engine.Token
	res, err := e.Generate(t.Context(), engine.Request{Endpoint: engine.EndpointChat, Body: json.RawMessage(client), MaxTokens: 30},
		func(tk engine.Token) error { toks = append(toks, tk); return nil })
	if err != nil {
		t.Fatal(err)
	}
	recs := sim.Records()
	last := recs[len(recs)-1]
	if last.Path != "/v1/chat/completions" {
		t.Fatalf("path %s, want /v1/chat/completions", last.Path)
	}
	var sent, orig map[string]json.RawMessage
	_ = json.Unmarshal(last.Body, &sent)
	_ = json.Unmarshal([]byte(client), &orig)
	rewritten := map[string]string{"model": `"sim"`, "stream": `true`, "max_tokens": `30`, "n": `1`,
		"stream_options": `{"continuous_usage_stats":true,"include_usage":true}`, "return_token_ids": `true`}
	for k, v := range orig {
		if want, ok := rewritten[k]; ok {
			v = json.RawMessage(want)
		}
		if !jsonEqual(sent[k], v) {
			t.Errorf("field %s: sent %s, want %s", k, sent[k], v)
		}
	}
	if len(sent) != len(orig)+1 || !jsonEqual(sent["return_token_ids"], json.RawMessage("true")) {
		t.Errorf("sent fields %d (%s), want the client's %d and return_token_ids", len(sent), last.Body, len(orig))
	}
	// The simulator calls the tool: tool-call deltas and logprobs come back.
	var args strings.Builder
	lp := 0
	for _, tk := range toks {
		var d engine.Details
		_ = json.Unmarshal(tk.Details, &d)
		var calls []struct {
			Function struct {
				Arguments string `json:"arguments"`
			} `json:"function"`
		}
		_ = json.Unmarshal(d.ToolCalls, &calls)
		for _, c := range calls {
			args.WriteString(c.Function.Arguments)
		}
		if d.Logprobs != nil {
			lp++
		}
		if !tk.HasID {
			t.Errorf("token %+v has no id", tk)
		}
	}
	if res.FinishReason != "tool_calls" || !strings.HasPrefix(args.String(), `{"input": "`) || lp == 0 {
		t.Errorf("finish %q, arguments %q, %d tokens with logprobs", res.FinishReason, args.String(), lp)
	}
	if res.PromptTokens != len(toks[0].PromptIDs) || res.CompletionTokens != len(toks) {
		t.Errorf("usage %+v, want %d prompt ids and %d tokens", res, len(toks[0].PromptIDs), len(toks))
	}
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

// TestOpenAIContinuations: a continuation goes as prompt ids + generated ids
// where the server takes them and yields exactly the rest of a seeded
// answer; elsewhere as assistant prefill.
func TestOpenAIContinuations(t *testing.T) {
	body := json.RawMessage(`{"model":"m","messages":[{"role":"user","content":"tell a story"}],"temperature":1.2,"seed":5,"max_tokens":24}`)
	for _, tc := range []struct {
		name     string
		cfg      vllmsim.Config
		wantPath string
	}{
		{name: "token ids", wantPath: "/v1/completions"},
		{name: "prefill", cfg: vllmsim.Config{NoTokenIDs: true}, wantPath: "/v1/chat/completions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, sim := simEngine(t, tc.cfg, engine.OpenAIConfig{})
			var full []engine.Token
			if _, err := e.Generate(t.Context(), engine.Request{Endpoint: engine.EndpointChat, Body: body, MaxTokens: 24},
				func(tk engine.Token) error { full = append(full, tk); return nil }); err != nil {
				t.Fatal(err)
			}
			const k = 9
			req := engine.Request{Endpoint: engine.EndpointChat, Body: body, MaxTokens: 24, StartOffset: k, PromptIDs: full[0].PromptIDs}
			for _, tk := range full[:k] {
				req.Generated += tk.Text
				if tk.HasID {
					req.GeneratedIDs = append(req.GeneratedIDs, tk.ID)
				}
			}
			var rest []engine.Token
			if _, err := e.Generate(t.Context(), req, func(tk engine.Token) error { rest = append(rest, tk); return nil }); err != nil {
				t.Fatal(err)
			}
			if got, want := text(rest), text(full[k:]); got != want {
				t.Errorf("continuation %q, want %q", got, want)
			}
			recs := sim.Records()
			last := recs[len(recs)-1]
			if last.Path != tc.wantPath {
				t.Errorf("continuation went to %s, want %s", last.Path, tc.wantPath)
			}
			var sent map[string]any
			_ = json.Unmarshal(last.Body, &sent)
			if sent["seed"] != 5.0 || sent["temperature"] != 1.2 || sent["max_tokens"] != float64(24-k) {
				t.Errorf("continuation body %s", last.Body)
			}
			if tc.wantPath == "/v1/completions" {
				if ids, _ := sent["prompt"].([]any); len(ids) != len(req.PromptIDs)+k {
					t.Errorf("prompt of %d ids, want %d", len(ids), len(req.PromptIDs)+k)
				}
			} else if sent["continue_final_message"] != true || sent["add_generation_prompt"] != false {
				t.Errorf("prefill body %s", last.Body)
			}
		})
	}
}

func text(toks []engine.Token) string {
	var b strings.Builder
	for _, tk := range toks {
		b.WriteString(tk.Text)
	}
	return b.String()
}

// TestOpenAIFailureClasses: each upstream failure comes back as an
// *UpstreamError of the right class, with the server's status, code,
// message and Retry-After.
func TestOpenAIFailureClasses(t *testing.T) {
	for _, tc := range []struct {
		fault      string
		class      string
		status     int
		code       string
		retryAfter time.Duration
		tokens     int
	}{
		{fault: "policy", class: events.FailureClient, status: 400, code: "content_policy_violation"},
		{fault: "context", class: events.FailureClient, status: 400, code: "BadRequestError"},
		{fault: "429:3", class: events.FailureUnavailable, status: 429, retryAfter: 3 * time.Second},
		{fault: "503", class: events.FailureUnavailable, status: 503},
		{fault: "404", class: events.FailureNotReady, status: 404},
		{fault: "401", class: events.FailureNotReady, status: 401},
		{fault: "500", status: 500},
		{fault: "500@3", status: 500, tokens: 3},
		{fault: "cut@2", tokens: 2},
		{fault: "malformed@2", tokens: 2},
		{fault: "nodone@4", tokens: 4},
		{fault: "stall", tokens: 0}, // the first-token timeout
	} {
		t.Run(tc.fault, func(t *testing.T) {
			e, _ := simEngine(t, vllmsim.Config{Fault: mustFault(t, tc.fault), FaultMatch: "FAULT"}, engine.OpenAIConfig{FirstTokenTimeout: 300 * time.Millisecond})
			n := 0
			_, err := e.Generate(t.Context(), engine.Request{Endpoint: engine.EndpointCompletions, Body: json.RawMessage(`{"model":"sim","prompt":"FAULT here","temperature":0}`), MaxTokens: 10},
				func(engine.Token) error { n++; return nil })
			var ue *engine.UpstreamError
			if !errors.As(err, &ue) {
				t.Fatalf("err %v, want an *UpstreamError", err)
			}
			if ue.Class != tc.class || ue.Status != tc.status || (tc.code != "" && ue.Code != tc.code) || ue.RetryAfter != tc.retryAfter || ue.Message == "" {
				t.Errorf("got %+v, want class %q status %d code %q retry after %v", ue, tc.class, tc.status, tc.code, tc.retryAfter)
			}
			if n != tc.tokens {
				t.Errorf("%d tokens before the failure, want %d", n, tc.tokens)
			}
			if errors.Is(err, engine.ErrFatal) || errors.Is(err, context.Canceled) {
				t.Errorf("error %v is fatal or a cancellation", err)
			}
		})
	}
}

func mustFault(t *testing.T, spec string) *vllmsim.Fault {
	f, err := vllmsim.ParseFault(spec)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestOpenAIPromptLimitInServerTokens: a first attempt whose prompt is over
// the limit in the server's tokens (its prompt ids) fails as a client error
// (413) before any token; a continuation is not checked (its prompt ids
// include the generated ones).
func TestOpenAIPromptLimitInServerTokens(t *testing.T) {
	e, _ := simEngine(t, vllmsim.Config{}, engine.OpenAIConfig{})
	body := json.RawMessage(`{"model":"sim","prompt":"qqqqqqqq qqqqqqqq","temperature":0}`) // 2 words, 17 byte tokens
	n := 0
	_, err := e.Generate(t.Context(), engine.Request{Endpoint: engine.EndpointCompletions, Body: body, MaxTokens: 5, MaxPromptTokens: 10},
		func(engine.Token) error { n++; return nil })
	var ue *engine.UpstreamError
	if !errors.As(err, &ue) || ue.Class != events.FailureClient || ue.Status != 413 || ue.Code != "prompt_too_large" || n != 0 {
		t.Fatalf("err %v after %d tokens, want a 413 client error before any", err, n)
	}
	if _, err := e.Generate(t.Context(), engine.Request{Endpoint: engine.EndpointCompletions, Body: body, MaxTokens: 5, MaxPromptTokens: 17},
		func(engine.Token) error { return nil }); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
}
