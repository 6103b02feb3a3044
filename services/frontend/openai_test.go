package frontend

import (
	"encoding/json"
	"net/http"
	"testing"
	"unicode/utf8"

	"github.com/baton-dev/baton/events"
)

func testFrontend() *Frontend {
	return &Frontend{cfg: Config{}.withDefaults()}
}

func TestParseRequest(t *testing.T) {
	fe := testFrontend()
	for _, tc := range []struct {
		name     string
		endpoint string
		body     string
		wantCode string
		check    func(t *testing.T, p parsed)
	}{
		{"chat", events.EndpointChat, `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`, "",
			func(t *testing.T, p parsed) {
				if p.prompt != "system: be brief\nuser: hi" || p.maxTokens != 7 || !p.stream || !p.includeUsage || p.n != 1 {
					t.Errorf("parsed = %+v", p)
				}
			}},
		{"completion defaults", events.EndpointCompletions, `{"model":"m","prompt":["one"],"temperature":0.7}`, "",
			func(t *testing.T, p parsed) {
				if p.prompt != "one" || p.maxTokens != DefaultMaxTokens || p.stream {
					t.Errorf("parsed = %+v", p)
				}
			}},
		{"max_completion_tokens", events.EndpointChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":9}`, "",
			func(t *testing.T, p parsed) {
				if p.maxTokens != 9 {
					t.Errorf("max tokens = %d, want 9", p.maxTokens)
				}
			}},
		{"n", events.EndpointCompletions, `{"model":"m","prompt":"x","n":3}`, "",
			func(t *testing.T, p parsed) {
				if p.n != 3 {
					t.Errorf("n = %d", p.n)
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
			p, err := fe.parseRequest(tc.endpoint, []byte(tc.body))
			switch {
			case tc.wantCode == "" && err != nil:
				t.Fatalf("error %v, want none", err)
			case tc.wantCode != "" && (err == nil || err.code != tc.wantCode):
				t.Fatalf("error %v, want code %s", err, tc.wantCode)
			}
			if tc.check != nil {
				tc.check(t, p)
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
	} {
		f.Add(s, true)
		f.Add(s, false)
	}
	fe := testFrontend()
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		endpoint := events.EndpointCompletions
		if chat {
			endpoint = events.EndpointChat
		}
		p, err := fe.parseRequest(endpoint, []byte(body))
		if err != nil {
			if err.status < 400 || err.status >= 500 || err.message == "" || err.code == "" {
				t.Fatalf("bad rejection %+v", err)
			}
			if !utf8.ValidString(err.message) && utf8.ValidString(body) {
				t.Fatalf("message is not UTF-8: %q", err.message)
			}
			if _, merr := json.Marshal(map[string]any{"error": errorBody(err.typ, err.code, err.message)}); merr != nil {
				t.Fatalf("error body does not encode: %v", merr)
			}
			return
		}
		if p.model == "" || p.maxTokens < 1 || p.maxTokens > fe.cfg.MaxTokensLimit || p.n < 1 || p.n > MaxChoices {
			t.Fatalf("accepted out of limits: %+v", p)
		}
		if err != nil && err.status == http.StatusOK {
			t.Fatal("unreachable")
		}
	})
}
