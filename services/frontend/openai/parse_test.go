package openai

import (
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/baton-dev/baton/events"
)

// TestParseRequestEdges: what the request parser refuses, with the code and
// (part of) the message a client reads, and the limits it applies.
func TestParseRequestEdges(t *testing.T) {
	parse := func(endpoint string, body []byte) (Completion, *ParamError) {
		return ParseCompletion(endpoint, body, 10, 100)
	}
	const user = `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		name     string
		endpoint string
		body     string
		wantCode string // "" accepts
		wantMsg  string // a substring of the message
		check    func(Completion) string
	}{
		{name: "empty body", endpoint: events.EndpointCompletions, body: ``, wantCode: "invalid_json"},
		{name: "not JSON", endpoint: events.EndpointCompletions, body: `{model:m}`, wantCode: "invalid_json", wantMsg: "not valid JSON"},
		{name: "truncated", endpoint: events.EndpointCompletions, body: `{"model":"m"`, wantCode: "invalid_json"},
		{name: "data after the object", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":"a"} {}`,
			wantCode: "invalid_json", wantMsg: "data after the JSON object"},
		{name: "trailing whitespace is fine", endpoint: events.EndpointCompletions, body: "{\"model\":\"m\",\"prompt\":\"a\"}\n \n"},
		{name: "a string body", endpoint: events.EndpointCompletions, body: `"hi"`, wantCode: "invalid_type", wantMsg: "must be a JSON object, got string"},
		{name: "a number body", endpoint: events.EndpointCompletions, body: `7`, wantCode: "invalid_type", wantMsg: "got number"},
		{name: "model not a string", endpoint: events.EndpointCompletions, body: `{"model":1,"prompt":"a"}`,
			wantCode: "invalid_type", wantMsg: "invalid type for 'model': expected a string, got number"},
		{name: "max_tokens a string", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":"a","max_tokens":"5"}`,
			wantCode: "invalid_type", wantMsg: "'max_tokens' must be an integer from 1 to 100, got string"},
		{name: "max_tokens a fraction", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":"a","max_tokens":1.5}`,
			wantCode: "invalid_type", wantMsg: "'max_tokens'"},
		{name: "stream a string", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":"a","stream":"yes"}`,
			wantCode: "invalid_type", wantMsg: "invalid type for 'stream': expected a boolean, got string"},
		{name: "model missing", endpoint: events.EndpointCompletions, body: `{"prompt":"a"}`, wantCode: "missing_model"},
		{name: "model null", endpoint: events.EndpointCompletions, body: `{"model":null,"prompt":"a"}`, wantCode: "missing_model"},
		{name: "prompt missing", endpoint: events.EndpointCompletions, body: `{"model":"m"}`, wantCode: "missing_prompt"},
		{name: "prompt null", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":null}`, wantCode: "missing_prompt"},
		{name: "prompt a number", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":5}`, wantCode: "invalid_type"},
		{name: "prompt token ids", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":[1,2]}`, wantCode: "invalid_type"},
		{name: "prompt an empty list", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":[]}`,
			wantCode: "unsupported_value", wantMsg: "got 0"},
		{name: "prompt an empty string is accepted", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":""}`,
			check: func(p Completion) string { return want(p.Prompt == "", "prompt %q", p.Prompt) }},
		{name: "messages missing", endpoint: events.EndpointChat, body: `{"model":"m"}`, wantCode: "missing_messages"},
		{name: "messages empty", endpoint: events.EndpointChat, body: `{"model":"m","messages":[]}`, wantCode: "invalid_value"},
		{name: "messages an object", endpoint: events.EndpointChat, body: `{"model":"m","messages":{"role":"user"}}`, wantCode: "invalid_type"},
		{name: "a chat ignores prompt", endpoint: events.EndpointChat, body: `{"model":"m","prompt":"x",` + user + `}`,
			check: func(p Completion) string { return want(p.Prompt == "user: hi", "prompt %q", p.Prompt) }},
		{name: "a completion ignores messages", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":"x",` + user + `}`,
			check: func(p Completion) string {
				return want(p.Prompt == "x" && p.Messages == nil, "prompt %q, messages %v", p.Prompt, p.Messages)
			}},
		{name: "text parts are joined", endpoint: events.EndpointChat,
			body:  `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`,
			check: func(p Completion) string { return want(p.Prompt == "user: ab", "prompt %q", p.Prompt) }},
		{name: "max_tokens 0", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":"a","max_tokens":0}`,
			wantCode: "invalid_value", wantMsg: "'max_tokens' must be an integer from 1 to 100, got 0"},
		{name: "max_tokens negative", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":"a","max_tokens":-3}`,
			wantCode: "invalid_value", wantMsg: "got -3"},
		{name: "max_tokens at the limit", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":"a","max_tokens":100}`,
			check: func(p Completion) string { return want(p.MaxTokens == 100, "max tokens %d", p.MaxTokens) }},
		{name: "max_tokens over the limit", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":"a","max_tokens":101}`,
			wantCode: "invalid_value", wantMsg: "'max_tokens' must be an integer from 1 to 100, got 101"},
		{name: "max_completion_tokens over the limit", endpoint: events.EndpointChat, body: `{"model":"m",` + user + `,"max_completion_tokens":101}`,
			wantCode: "invalid_value", wantMsg: "'max_completion_tokens' must be an integer from 1 to 100, got 101"},
		{name: "max_completion_tokens wins over max_tokens", endpoint: events.EndpointChat, body: `{"model":"m",` + user + `,"max_tokens":5,"max_completion_tokens":6}`,
			check: func(p Completion) string { return want(p.MaxTokens == 6, "max tokens %d", p.MaxTokens) }},
		{name: "the configured default", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":"a"}`,
			check: func(p Completion) string {
				return want(p.MaxTokens == 10 && p.N == 1 && !p.Stream && !p.IncludeUsage, "%+v", p)
			}},
		{name: "max_tokens null is the default", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":"a","max_tokens":null}`,
			check: func(p Completion) string { return want(p.MaxTokens == 10, "max tokens %d", p.MaxTokens) }},
		{name: "n 0", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":"a","n":0}`, wantCode: "invalid_value", wantMsg: "'n' must be an integer from 1 to 16, got 0"},
		{name: "n at the most", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":"a","n":16}`,
			check: func(p Completion) string { return want(p.N == MaxChoices, "n %d", p.N) }},
		{name: "include_usage false", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":"a","stream":true,"stream_options":{"include_usage":false}}`,
			check: func(p Completion) string { return want(p.Stream && !p.IncludeUsage, "%+v", p) }},
		{name: "stream_options without include_usage", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":"a","stream_options":{}}`,
			check: func(p Completion) string { return want(!p.IncludeUsage, "%+v", p) }},
		{name: "unknown fields are ignored", endpoint: events.EndpointCompletions, body: `{"model":"m","prompt":"a","logit_bias":{"1":2},"user":"u"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := parse(tc.endpoint, []byte(tc.body))
			if tc.wantCode == "" {
				if err != nil {
					t.Fatalf("got %v (%s), want accepted", err, err.Code)
				}
				if tc.check != nil {
					if msg := tc.check(p); msg != "" {
						t.Error(msg)
					}
				}
				return
			}
			if err == nil {
				t.Fatalf("got accepted %+v, want %s", p, tc.wantCode)
			}
			if err.Code != tc.wantCode || err.Status != http.StatusBadRequest || err.Type != "invalid_request_error" {
				t.Errorf("got %d %s %s, want 400 invalid_request_error %s", err.Status, err.Type, err.Code, tc.wantCode)
			}
			if !strings.Contains(err.Message, tc.wantMsg) {
				t.Errorf("got message %q, want it to contain %q", err.Message, tc.wantMsg)
			}
		})
	}
}

// TestParseRequestSampling: temperature, top_p and seed must be numbers in
// OpenAI's ranges on chat and completions, as on /v1/responses; anything
// else is a 400 whose body names the param (formerly any JSON was accepted).
func TestParseRequestSampling(t *testing.T) {
	parse := parseDefault
	cases := []struct {
		name, param, value string
		wantCode           string // "" accepts
		wantMsg            string
	}{
		{name: "temperature an object", param: "temperature", value: `{"a":1}`, wantCode: "invalid_type", wantMsg: "'temperature' must be a number from 0 to 2, got object"},
		{name: "temperature an array", param: "temperature", value: `[1]`, wantCode: "invalid_type", wantMsg: "got array"},
		{name: "temperature a string", param: "temperature", value: `"10"`, wantCode: "invalid_type", wantMsg: "got string"},
		{name: "temperature a boolean", param: "temperature", value: `true`, wantCode: "invalid_type", wantMsg: "got bool"},
		{name: "temperature 1e308", param: "temperature", value: `1e308`, wantCode: "invalid_value", wantMsg: "'temperature' must be a number from 0 to 2, got 1e+308"},
		{name: "temperature past float64", param: "temperature", value: `1e999`, wantCode: "invalid_type", wantMsg: "got 1e999"},
		{name: "temperature negative", param: "temperature", value: `-0.1`, wantCode: "invalid_value", wantMsg: "got -0.1"},
		{name: "temperature over 2", param: "temperature", value: `2.01`, wantCode: "invalid_value", wantMsg: "got 2.01"},
		{name: "temperature 0", param: "temperature", value: `0`},
		{name: "temperature 2", param: "temperature", value: `2`},
		{name: "temperature null", param: "temperature", value: `null`},
		{name: "top_p an object", param: "top_p", value: `{"a":1}`, wantCode: "invalid_type", wantMsg: "'top_p' must be a number from 0 to 1, got object"},
		{name: "top_p an array", param: "top_p", value: `[1]`, wantCode: "invalid_type", wantMsg: "got array"},
		{name: "top_p a string", param: "top_p", value: `"10"`, wantCode: "invalid_type", wantMsg: "got string"},
		{name: "top_p a boolean", param: "top_p", value: `true`, wantCode: "invalid_type", wantMsg: "got bool"},
		{name: "top_p 1e308", param: "top_p", value: `1e308`, wantCode: "invalid_value", wantMsg: "got 1e+308"},
		{name: "top_p over 1", param: "top_p", value: `1.5`, wantCode: "invalid_value", wantMsg: "'top_p' must be a number from 0 to 1, got 1.5"},
		{name: "top_p negative", param: "top_p", value: `-1`, wantCode: "invalid_value", wantMsg: "got -1"},
		{name: "top_p 0.9", param: "top_p", value: `0.9`},
		{name: "seed an object", param: "seed", value: `{"a":1}`, wantCode: "invalid_type", wantMsg: "'seed' must be an integer, got object"},
		{name: "seed an array", param: "seed", value: `[1]`, wantCode: "invalid_type", wantMsg: "got array"},
		{name: "seed a string", param: "seed", value: `"10"`, wantCode: "invalid_type", wantMsg: "got string"},
		{name: "seed a boolean", param: "seed", value: `true`, wantCode: "invalid_type", wantMsg: "got bool"},
		{name: "seed 1e308", param: "seed", value: `1e308`, wantCode: "invalid_type", wantMsg: "got 1e308"},
		{name: "seed a fraction", param: "seed", value: `1.5`, wantCode: "invalid_type", wantMsg: "got 1.5"},
		{name: "seed past int64", param: "seed", value: `9223372036854775808`, wantCode: "invalid_type", wantMsg: "got 9223372036854775808"},
		{name: "seed negative", param: "seed", value: `-7`},
		{name: "seed the largest int64", param: "seed", value: `9223372036854775807`},
		{name: "seed null", param: "seed", value: `null`},
	}
	for _, endpoint := range []string{events.EndpointChat, events.EndpointCompletions} {
		for _, tc := range cases {
			t.Run(endpoint+"/"+tc.name, func(t *testing.T) {
				body := `{"model":"m","prompt":"a","messages":[{"role":"user","content":"hi"}],"` + tc.param + `":` + tc.value + `}`
				_, err := parse(endpoint, []byte(body))
				if tc.wantCode == "" {
					if err != nil {
						t.Fatalf("got %d %s %q, want accepted", err.Status, err.Code, err.Message)
					}
					return
				}
				if err == nil {
					t.Fatalf("got accepted, want 400 %s", tc.wantCode)
				}
				if err.Status != http.StatusBadRequest || err.Code != tc.wantCode || err.Param != tc.param || !strings.Contains(err.Message, tc.wantMsg) {
					t.Errorf("got %d %s param %q %q, want 400 %s param %q containing %q", err.Status, err.Code, err.Param, err.Message, tc.wantCode, tc.param, tc.wantMsg)
				}
				if body := err.Body(); body["param"] != tc.param || body["code"] != tc.wantCode || body["type"] != "invalid_request_error" {
					t.Errorf("got body %v, want OpenAI's error shape with param %q", body, tc.param)
				}
			})
		}
	}
}

// want returns "" if ok, else "got " and the formatted value.
func want(ok bool, format string, args ...any) string {
	if ok {
		return ""
	}
	return "got " + fmt.Sprintf(format, args...)
}

func TestRenderChat(t *testing.T) {
	cases := []struct {
		name string
		msgs []events.Message
		want string
	}{
		{"none", nil, ""},
		{"one", []events.Message{{Role: "user", Content: "hi"}}, "user: hi"},
		{"several, one a line", []events.Message{{Role: "system", Content: "s"}, {Role: "user", Content: "u"}, {Role: "assistant", Content: ""}},
			"system: s\nuser: u\nassistant: "},
		{"content with newlines is kept", []events.Message{{Role: "user", Content: "a\nb"}}, "user: a\nb"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := renderChat(tc.msgs); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestJSONKind(t *testing.T) {
	var (
		i  int
		f  float64
		b  bool
		s  string
		pi *int
		ps **string
	)
	cases := []struct {
		in   any
		want string
	}{
		{i, "an integer"}, {uint8(0), "an integer"}, {f, "a number"}, {b, "a boolean"}, {s, "a string"},
		{pi, "an integer"}, {ps, "a string"}, {struct{}{}, "an object"}, {map[string]int{}, "an object"},
	}
	for _, tc := range cases {
		if got := jsonKind(reflect.TypeOf(tc.in)); got != tc.want {
			t.Errorf("jsonKind(%T): got %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestEstimateTokens(t *testing.T) {
	cases := []struct {
		in   string
		want int
	}{
		{"", 0}, {"   ", 0}, {"one", 1}, {"one two  three", 3}, {"a\nb\tc", 3}, {"user: hi\nassistant: ", 3},
	}
	for _, tc := range cases {
		if got := EstimateTokens(tc.in); got != tc.want {
			t.Errorf("EstimateTokens(%q): got %d, want %d", tc.in, got, tc.want)
		}
	}
}
