package openai

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/baton-dev/baton/events"
)

// The edge's defaults of --default-max-tokens and --max-tokens-limit.
const testDefaultMaxTokens, testMaxTokensLimit = 64, 32768

// parseDefault parses as the edge does with its default limits.
func parseDefault(endpoint string, body []byte) (Completion, *ParamError) {
	return ParseCompletion(endpoint, body, testDefaultMaxTokens, testMaxTokensLimit)
}

func TestParseRequest(t *testing.T) {
	parse := parseDefault
	for _, tc := range []struct {
		name     string
		endpoint string
		body     string
		wantCode string
		check    func(t *testing.T, p Completion)
	}{
		{"chat", events.EndpointChat, `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`, "",
			func(t *testing.T, p Completion) {
				if p.Prompt != "system: be brief\nuser: hi" || p.MaxTokens != 7 || !p.Stream || !p.IncludeUsage || p.N != 1 {
					t.Errorf("Completion = %+v", p)
				}
			}},
		{"completion defaults", events.EndpointCompletions, `{"model":"m","prompt":["one"],"temperature":0.7}`, "",
			func(t *testing.T, p Completion) {
				if p.Prompt != "one" || p.MaxTokens != testDefaultMaxTokens || p.Stream {
					t.Errorf("Completion = %+v", p)
				}
			}},
		{"max_completion_tokens", events.EndpointChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":9}`, "",
			func(t *testing.T, p Completion) {
				if p.MaxTokens != 9 {
					t.Errorf("max tokens = %d, want 9", p.MaxTokens)
				}
			}},
		{"n", events.EndpointCompletions, `{"model":"m","prompt":"x","n":3}`, "",
			func(t *testing.T, p Completion) {
				if p.N != 3 {
					t.Errorf("n = %d", p.N)
				}
			}},
		{"array body", events.EndpointCompletions, `[]`, "invalid_type", nil},
		{"null content", events.EndpointChat, `{"model":"m","messages":[{"role":"assistant","content":null}]}`, "", nil},
		{"image part", events.EndpointChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, "invalid_type", nil},
		{"two prompts", events.EndpointCompletions, `{"model":"m","prompt":["a","b"]}`, "unsupported_value", nil},
		{"n too large", events.EndpointCompletions, `{"model":"m","prompt":"a","n":17}`, "invalid_value", nil},
		{"empty model", events.EndpointCompletions, `{"model":"","prompt":"a"}`, "missing_model", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := parse(tc.endpoint, []byte(tc.body))
			switch {
			case tc.wantCode == "" && err != nil:
				t.Fatalf("error %v, want none", err)
			case tc.wantCode != "" && (err == nil || err.Code != tc.wantCode):
				t.Fatalf("error %v, want code %s", err, tc.wantCode)
			}
			if tc.check != nil {
				tc.check(t, p)
			}
		})
	}
}

// TestParseRequestMessages: a rejection says what the field must be, in the
// client's terms.
func TestParseRequestMessages(t *testing.T) {
	parse := parseDefault
	limit := testMaxTokensLimit
	for _, tc := range []struct {
		name     string
		body     string // fields after "model" and "prompt"
		wantCode string
		wantMsg  string
	}{
		{name: "max_tokens exponent", body: `"max_tokens":1e3`, wantCode: "invalid_type",
			wantMsg: fmt.Sprintf("'max_tokens' must be an integer from 1 to %d, got 1e3", limit)},
		{name: "max_tokens fraction", body: `"max_tokens":2.5`, wantCode: "invalid_type",
			wantMsg: fmt.Sprintf("'max_tokens' must be an integer from 1 to %d, got 2.5", limit)},
		{name: "max_tokens past int64", body: `"max_tokens":99999999999999999999`, wantCode: "invalid_type",
			wantMsg: fmt.Sprintf("'max_tokens' must be an integer from 1 to %d, got 99999999999999999999", limit)},
		{name: "max_tokens string", body: `"max_tokens":"10"`, wantCode: "invalid_type",
			wantMsg: fmt.Sprintf("'max_tokens' must be an integer from 1 to %d, got string", limit)},
		{name: "max_tokens zero", body: `"max_tokens":0`, wantCode: "invalid_value",
			wantMsg: fmt.Sprintf("'max_tokens' must be an integer from 1 to %d, got 0", limit)},
		{name: "max_tokens past the limit", body: fmt.Sprintf(`"max_tokens":%d`, limit+1), wantCode: "invalid_value",
			wantMsg: fmt.Sprintf("'max_tokens' must be an integer from 1 to %d, got %d", limit, limit+1)},
		{name: "max_completion_tokens fraction", body: `"max_completion_tokens":2.5`, wantCode: "invalid_type",
			wantMsg: fmt.Sprintf("'max_completion_tokens' must be an integer from 1 to %d, got 2.5", limit)},
		{name: "n fraction", body: `"n":1.5`, wantCode: "invalid_type",
			wantMsg: fmt.Sprintf("'n' must be an integer from 1 to %d, got 1.5", MaxChoices)},
		{name: "n too large", body: `"n":17`, wantCode: "invalid_value",
			wantMsg: fmt.Sprintf("'n' must be an integer from 1 to %d, got 17", MaxChoices)},
		{name: "stream_options string", body: `"stream_options":"x"`, wantCode: "invalid_type",
			wantMsg: `'stream_options' must be an object such as {"include_usage": true}, got string`},
		{name: "stream_options array", body: `"stream_options":[true]`, wantCode: "invalid_type",
			wantMsg: `'stream_options' must be an object such as {"include_usage": true}, got array`},
		{name: "include_usage string", body: `"stream_options":{"include_usage":"yes"}`, wantCode: "invalid_type",
			wantMsg: "invalid type for 'stream_options.include_usage': expected a boolean, got string"},
		{name: "stream number", body: `"stream":1`, wantCode: "invalid_type",
			wantMsg: "invalid type for 'stream': expected a boolean, got number"},
		{name: "model object", body: `"model":{}`, wantCode: "invalid_type",
			wantMsg: "invalid type for 'model': expected a string, got object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"prompt":"hi",` + tc.body + `}`
			if !strings.Contains(tc.body, `"model"`) {
				body = `{"model":"m","prompt":"hi",` + tc.body + `}`
			}
			_, err := parse(events.EndpointCompletions, []byte(body))
			if err == nil {
				t.Fatalf("accepted %s, want %s", body, tc.wantCode)
			}
			if err.Status != http.StatusBadRequest || err.Code != tc.wantCode || err.Message != tc.wantMsg {
				t.Errorf("got %d %s %q,\nwant 400 %s %q", err.Status, err.Code, err.Message, tc.wantCode, tc.wantMsg)
			}
		})
	}
}

// FuzzParseRequest: no body panics the parser; every rejection is a 4xx
// with a message; every acceptance is within the configured limits.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}`,
		`{"model":"m","prompt":"once upon","n":2,"stream_options":{"include_usage":true}}`,
		`{"model":"m","prompt":["a"],"max_completion_tokens":1}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`,
		`{`, `null`, `[]`, `{"max_tokens":-1}`,
		`{"model":"m","prompt":"a","max_tokens":1e3}`, `{"model":"m","prompt":"a","max_tokens":99999999999999999999}`,
		`{"model":"m","prompt":"a","stream_options":"x"}`, `{"model":"m","prompt":"a","n":2.5}`,
		`{"model":"m","prompt":"a","temperature":0.7,"top_p":0.9,"seed":42}`, `{"model":"m","prompt":"a","temperature":"1"}`,
		`{"model":"m","prompt":"a","top_p":1e308}`, `{"model":"m","prompt":"a","seed":[1]}`,
	} {
		f.Add(s, true)
		f.Add(s, false)
	}
	parse := parseDefault
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		endpoint := events.EndpointCompletions
		if chat {
			endpoint = events.EndpointChat
		}
		p, err := parse(endpoint, []byte(body))
		if err == nil {
			// An accepted sampling parameter is a number in OpenAI's range.
			var s struct {
				Temperature any `json:"temperature"`
				TopP        any `json:"top_p"`
				Seed        any `json:"seed"`
			}
			_ = json.Unmarshal([]byte(body), &s)
			for _, v := range []struct {
				name     string
				got      any
				min, max float64
			}{{"temperature", s.Temperature, 0, 2}, {"top_p", s.TopP, 0, 1}} {
				if f, ok := v.got.(float64); v.got != nil && (!ok || f < v.min || f > v.max) {
					t.Fatalf("accepted %s %v", v.name, v.got)
				}
			}
			if _, ok := s.Seed.(float64); s.Seed != nil && !ok {
				t.Fatalf("accepted seed %v", s.Seed)
			}
		}
		if err != nil {
			if err.Status < 400 || err.Status >= 500 || err.Message == "" || err.Code == "" {
				t.Fatalf("bad rejection %+v", err)
			}
			if !utf8.ValidString(err.Message) && utf8.ValidString(body) {
				t.Fatalf("message is not UTF-8: %q", err.Message)
			}
			if _, merr := json.Marshal(map[string]any{"error": ErrorBody(err.Type, err.Code, err.Message)}); merr != nil {
				t.Fatalf("error body does not encode: %v", merr)
			}
			return
		}
		if p.Model == "" || p.MaxTokens < 1 || p.MaxTokens > testMaxTokensLimit || p.N < 1 || p.N > MaxChoices {
			t.Fatalf("accepted out of limits: %+v", p)
		}
		if err != nil && err.Status == http.StatusOK {
			t.Fatal("unreachable")
		}
	})
}
