package vllmsim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestTokenizeRoundTrip(t *testing.T) {
	for _, s := range []string{"", "the model answers", " river, stone!", "<|im_start|>user\nhi<|im_end|>\n", "ünïcode ✓ 123", "<|im_sta"} {
		ids := Tokenize(s)
		got, ok := Detokenize(ids)
		if !ok || got != s {
			t.Errorf("Detokenize(Tokenize(%q)) = %q, %v", s, got, ok)
		}
	}
	if got := Tokenize(" river"); len(got) != 1 {
		t.Errorf("Tokenize(%q) = %v, want one word token", " river", got)
	}
	if got := Tokenize("<|im_end|>"); !reflect.DeepEqual(got, []int{idImEnd}) {
		t.Errorf("special token: got %v", got)
	}
}

func TestChatTemplate(t *testing.T) {
	msgs := []ChatMessage{
		{Role: "user", Content: json.RawMessage(`"hi"`)},
		{Role: "assistant", Content: json.RawMessage(`"the river"`)},
	}
	cases := []struct {
		name          string
		gen, cont     bool
		want, wantErr string
	}{
		{name: "generation prompt", gen: true, want: "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nthe river<|im_end|>\n<|im_start|>assistant\n"},
		{name: "continue final", cont: true, want: "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nthe river"},
		{name: "closed", want: "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nthe river<|im_end|>\n"},
		{name: "both", gen: true, cont: true, wantErr: "both"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ApplyChatTemplate(msgs, nil, c.gen, c.cont)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("got err %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %q, %v\nwant %q", got, err, c.want)
			}
		})
	}
}

func TestParseFault(t *testing.T) {
	cases := []struct {
		spec string
		want *Fault
		bad  bool
	}{
		{spec: "", want: nil},
		{spec: "500@3", want: &Fault{Kind: FaultStatus, Status: 500, After: 3}},
		{spec: "429:2", want: &Fault{Kind: FaultStatus, Status: 429, RetryAfter: 2}},
		{spec: "cut@5", want: &Fault{Kind: FaultCut, After: 5}},
		{spec: "policy", want: &Fault{Kind: FaultPolicy}},
		{spec: "policy@2", bad: true},
		{spec: "200", bad: true},
		{spec: "stall@x", bad: true},
	}
	for _, c := range cases {
		got, err := ParseFault(c.spec)
		if c.bad {
			if err == nil {
				t.Errorf("ParseFault(%q) = %+v, want an error", c.spec, got)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("ParseFault(%q) = %+v, %v, want %+v", c.spec, got, err, c.want)
		}
		if got != nil && got.String() != c.spec && !strings.HasSuffix(got.String(), "@0") {
			t.Errorf("String() = %q, want %q", got.String(), c.spec)
		}
	}
}

// sim starts a simulator for cfg.
func sim(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	s := New(cfg)
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts.URL
}

func call(t *testing.T, url, path string, body any, header map[string]string) *http.Response {
	t.Helper()
	data, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, url+path, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func decode(t *testing.T, resp *http.Response) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatalf("decode %s: %v", resp.Status, err)
	}
	return m
}

// streamResult is a parsed SSE answer.
type streamResult struct {
	chunks    []map[string]any
	malformed int
	done      bool
	readErr   error
}

func readSSE(resp *http.Response) streamResult {
	var r streamResult
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			r.done = true
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(data), &m) != nil {
			r.malformed++
			continue
		}
		r.chunks = append(r.chunks, m)
	}
	r.readErr = sc.Err()
	return r
}

// answer is what a stream said: text, token ids, finish reason, usage.
type answer struct {
	text, finish, args string
	ids, promptIDs     []int
	usage              map[string]any
	logprobs           int
	errors             []map[string]any
}

func ints(v any) []int {
	var out []int
	for _, x := range v.([]any) {
		out = append(out, int(x.(float64)))
	}
	return out
}

func (r streamResult) answer() answer {
	var a answer
	for _, c := range r.chunks {
		if e, ok := c["error"].(map[string]any); ok {
			a.errors = append(a.errors, e)
			continue
		}
		if u, ok := c["usage"].(map[string]any); ok {
			a.usage = u
		}
		if p, ok := c["prompt_token_ids"]; ok {
			a.promptIDs = ints(p)
		}
		for _, ch := range c["choices"].([]any) {
			ch := ch.(map[string]any)
			if p, ok := ch["prompt_token_ids"]; ok {
				a.promptIDs = ints(p)
			}
			if ids, ok := ch["token_ids"]; ok {
				a.ids = append(a.ids, ints(ids)...)
			}
			if f, ok := ch["finish_reason"].(string); ok {
				a.finish = f
			}
			if lp, ok := ch["logprobs"].(map[string]any); ok {
				if content, ok := lp["content"].([]any); ok {
					a.logprobs += len(content)
				}
				if toks, ok := lp["tokens"].([]any); ok {
					a.logprobs += len(toks)
				}
			}
			if s, ok := ch["text"].(string); ok {
				a.text += s
			}
			if d, ok := ch["delta"].(map[string]any); ok {
				if s, ok := d["content"].(string); ok {
					a.text += s
				}
				if calls, ok := d["tool_calls"].([]any); ok {
					for _, call := range calls {
						fn := call.(map[string]any)["function"].(map[string]any)
						a.args += fn["arguments"].(string)
					}
				}
			}
		}
	}
	return a
}

func chatBody(extra map[string]any) map[string]any {
	b := map[string]any{"model": "sim", "messages": []map[string]any{{"role": "user", "content": "tell me about the river"}}, "max_tokens": 12, "stream": true}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

func TestStreamAndUnaryAgree(t *testing.T) {
	_, url := sim(t, Config{})
	for _, chat := range []bool{true, false} {
		path, body := "/v1/chat/completions", chatBody(map[string]any{"temperature": 0.9, "seed": 7, "return_token_ids": true, "stream_options": map[string]any{"include_usage": true}})
		if !chat {
			path = "/v1/completions"
			delete(body, "messages")
			body["prompt"] = "once upon a time"
		}
		if chat {
			body["logprobs"], body["top_logprobs"] = true, 3
		} else {
			body["logprobs"] = 2
		}
		a := readSSE(call(t, url, path, body, nil)).answer()
		body["stream"] = false
		m := decode(t, call(t, url, path, body, nil))
		choice := m["choices"].([]any)[0].(map[string]any)
		text, _ := choice["text"].(string)
		if chat {
			text = choice["message"].(map[string]any)["content"].(string)
		}
		if a.text != text || a.text == "" {
			t.Errorf("%s: streamed %q, unary %q", path, a.text, text)
		}
		if !reflect.DeepEqual(a.ids, ints(choice["token_ids"])) || len(a.ids) != 12 {
			t.Errorf("%s: streamed ids %v, unary %v", path, a.ids, choice["token_ids"])
		}
		if got, _ := Detokenize(a.ids); got != a.text {
			t.Errorf("%s: ids detokenize to %q, text %q", path, got, a.text)
		}
		if a.finish != "length" || a.logprobs != 12 {
			t.Errorf("%s: finish %q, %d logprobs; want length, 12", path, a.finish, a.logprobs)
		}
		if a.usage["completion_tokens"] != 12.0 || int(a.usage["prompt_tokens"].(float64)) != len(a.promptIDs) || len(a.promptIDs) == 0 {
			t.Errorf("%s: usage %v with %d prompt ids", path, a.usage, len(a.promptIDs))
		}
	}
}

func TestSeededSamplingRepeatsAndContinuesFromTokenIDs(t *testing.T) {
	_, url := sim(t, Config{})
	body := chatBody(map[string]any{"temperature": 1.3, "seed": 42, "return_token_ids": true, "max_tokens": 20})
	first := readSSE(call(t, url, "/v1/chat/completions", body, nil)).answer()
	again := readSSE(call(t, url, "/v1/chat/completions", body, nil)).answer()
	if first.text != again.text || len(first.ids) != 20 {
		t.Fatalf("seeded runs differ:\n%q\n%q", first.text, again.text)
	}
	// A continuation: prompt ids + the first 7 generated ids, same sampling.
	prompt := append(append([]int{}, first.promptIDs...), first.ids[:7]...)
	rest := readSSE(call(t, url, "/v1/completions", map[string]any{"model": "sim", "prompt": prompt, "max_tokens": 13,
		"temperature": 1.3, "seed": 42, "return_token_ids": true, "stream": true}, nil)).answer()
	if !reflect.DeepEqual(rest.ids, first.ids[7:]) {
		t.Fatalf("continuation ids %v, want %v", rest.ids, first.ids[7:])
	}
	// Prefill: the assistant's text so far, continued.
	soFar, _ := Detokenize(first.ids[:7])
	pre := chatBody(map[string]any{"temperature": 1.3, "seed": 42, "max_tokens": 13, "continue_final_message": true, "add_generation_prompt": false,
		"messages": []map[string]any{{"role": "user", "content": "tell me about the river"}, {"role": "assistant", "content": soFar}}})
	if got := readSSE(call(t, url, "/v1/chat/completions", pre, nil)).answer(); soFar+got.text != first.text {
		t.Fatalf("prefill continuation %q + %q, want %q", soFar, got.text, first.text)
	}
	// Unseeded sampling at temperature > 0 differs between runs.
	delete(body, "seed")
	texts := map[string]bool{}
	for range 4 {
		texts[readSSE(call(t, url, "/v1/chat/completions", body, nil)).answer().text] = true
	}
	if len(texts) == 1 {
		t.Errorf("4 unseeded runs at temperature 1.3 gave the same text")
	}
}

func TestToolCallDeltas(t *testing.T) {
	_, url := sim(t, Config{})
	tools := []map[string]any{{"type": "function", "function": map[string]any{"name": "lookup", "parameters": map[string]any{"type": "object"}}}}
	a := readSSE(call(t, url, "/v1/chat/completions", chatBody(map[string]any{"tools": tools, "temperature": 0, "max_tokens": 50}), nil)).answer()
	var args map[string]string
	if err := json.Unmarshal([]byte(a.args), &args); err != nil || args["input"] == "" {
		t.Fatalf("arguments %q: %v", a.args, err)
	}
	if a.finish != "tool_calls" || a.text != "" {
		t.Fatalf("finish %q, text %q; want tool_calls and no content", a.finish, a.text)
	}
}

func TestStopString(t *testing.T) {
	_, url := sim(t, Config{})
	full := readSSE(call(t, url, "/v1/chat/completions", chatBody(map[string]any{"temperature": 0}), nil)).answer()
	words := strings.Fields(full.text)
	stop := " " + words[3]
	got := readSSE(call(t, url, "/v1/chat/completions", chatBody(map[string]any{"temperature": 0, "stop": []string{stop}}), nil)).answer()
	if want := full.text[:strings.Index(full.text, stop)]; got.text != want || got.finish != "stop" {
		t.Fatalf("got %q (%s), want %q (stop)", got.text, got.finish, want)
	}
}

func TestFaults(t *testing.T) {
	_, url := sim(t, Config{})
	cases := []struct {
		fault      string
		status     int
		retryAfter string
		code       any
		tokens     int
		done       bool
		malformed  int
		errEvent   bool
		readErr    bool
	}{
		{fault: "503:2", status: 503, retryAfter: "2", code: 503.0},
		{fault: "429", status: 429, code: 429.0},
		{fault: "500@3", status: 200, tokens: 3, errEvent: true, done: true},
		{fault: "cut@4", status: 200, tokens: 4, readErr: true},
		{fault: "malformed@2", status: 200, tokens: 12, malformed: 1, done: true},
		{fault: "nodone@5", status: 200, tokens: 5},
		{fault: "policy", status: 400, code: "content_policy_violation"},
		{fault: "context", status: 400, code: 400.0},
	}
	for _, c := range cases {
		t.Run(c.fault, func(t *testing.T) {
			resp := call(t, url, "/v1/chat/completions", chatBody(map[string]any{"temperature": 0, "return_token_ids": true}), map[string]string{FaultHeader: c.fault})
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.status)
			}
			if resp.StatusCode != 200 {
				if got := resp.Header.Get("Retry-After"); got != c.retryAfter {
					t.Errorf("Retry-After %q, want %q", got, c.retryAfter)
				}
				e := decode(t, resp)["error"].(map[string]any)
				if e["code"] != c.code || e["message"] == "" {
					t.Errorf("error %v, want code %v", e, c.code)
				}
				return
			}
			r := readSSE(resp)
			a := r.answer()
			if len(a.ids) != c.tokens || r.done != c.done || r.malformed != c.malformed || (len(a.errors) > 0) != c.errEvent || (r.readErr != nil) != c.readErr {
				t.Fatalf("tokens %d done %v malformed %d errors %v readErr %v", len(a.ids), r.done, r.malformed, a.errors, r.readErr)
			}
			if c.fault == "nodone@5" && a.finish != "" {
				t.Errorf("finish %q, want none", a.finish)
			}
		})
	}
	t.Run("stall@2", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		data, _ := json.Marshal(chatBody(map[string]any{"return_token_ids": true}))
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(data))
		req.Header.Set(FaultHeader, "stall@2")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got := make(chan answer, 1)
		go func() { got <- readSSE(resp).answer() }()
		select {
		case a := <-got:
			t.Fatalf("a stalled stream ended: %+v", a)
		case <-time.After(200 * time.Millisecond): // it must not end by itself: nothing to wait on but time
		}
		cancel()
		if a := <-got; len(a.ids) != 2 {
			t.Fatalf("%d tokens before the stall, want 2", len(a.ids))
		}
	})
}

func TestProcessFaultAndFlags(t *testing.T) {
	s, url := sim(t, Config{Fault: &Fault{Kind: FaultStatus, Status: 429, RetryAfter: 1}, FaultRequests: 1, ChatOnly: true, RejectPrefill: true, APIKey: "k"})
	auth := map[string]string{"Authorization": "Bearer k"}
	if resp := call(t, url, "/v1/chat/completions", chatBody(nil), auth); resp.StatusCode != 429 {
		t.Errorf("first request: %d, want 429", resp.StatusCode)
	}
	if resp := call(t, url, "/v1/chat/completions", chatBody(nil), auth); resp.StatusCode != 200 {
		t.Errorf("second request: %d, want 200 (--fault-requests 1)", resp.StatusCode)
	}
	if resp := call(t, url, "/v1/chat/completions", chatBody(nil), nil); resp.StatusCode != 401 {
		t.Errorf("no key: %d, want 401", resp.StatusCode)
	}
	if resp := call(t, url, "/v1/completions", map[string]any{"model": "sim", "prompt": "x"}, auth); resp.StatusCode != 404 {
		t.Errorf("chat only, completions: %d, want 404", resp.StatusCode)
	}
	if resp := call(t, url, "/v1/chat/completions", chatBody(map[string]any{"model": "other"}), auth); resp.StatusCode != 404 {
		t.Errorf("unknown model: %d, want 404", resp.StatusCode)
	}
	pre := chatBody(map[string]any{"continue_final_message": true, "add_generation_prompt": false,
		"messages": []map[string]any{{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the"}}})
	if resp := call(t, url, "/v1/chat/completions", pre, auth); resp.StatusCode != 400 {
		t.Errorf("prefill: %d, want 400", resp.StatusCode)
	}
	recs := s.Records()
	if len(recs) != 6 || recs[0].Fault != "429:1@0" || recs[1].Fault != "" {
		t.Fatalf("records %+v", recs)
	}
	var body map[string]any
	if err := json.Unmarshal(recs[5].Body, &body); err != nil || body["continue_final_message"] != true {
		t.Errorf("recorded body %s", recs[5].Body)
	}

	_, url = sim(t, Config{NoTokenIDs: true})
	if resp := call(t, url, "/v1/completions", map[string]any{"model": "sim", "prompt": []int{300, 301}}, nil); resp.StatusCode != 400 {
		t.Errorf("token-id prompt without token ids: %d, want 400", resp.StatusCode)
	}
	if a := readSSE(call(t, url, "/v1/chat/completions", chatBody(map[string]any{"return_token_ids": true}), nil)).answer(); a.ids != nil || a.promptIDs != nil || a.text == "" {
		t.Errorf("no-token-ids server returned ids %v %v", a.ids, a.promptIDs)
	}
}

func TestTokenizerEndpointsAndRecords(t *testing.T) {
	_, url := sim(t, Config{MaxModelLen: 100})
	m := decode(t, call(t, url, "/tokenize", map[string]any{"model": "sim", "prompt": "the river flows"}, nil))
	ids := ints(m["tokens"])
	if int(m["count"].(float64)) != len(ids) || m["max_model_len"] != 100.0 {
		t.Fatalf("tokenize: %v", m)
	}
	if d := decode(t, call(t, url, "/detokenize", map[string]any{"model": "sim", "tokens": ids}, nil)); d["prompt"] != "the river flows" {
		t.Fatalf("detokenize: %v", d)
	}
	chat := decode(t, call(t, url, "/tokenize", map[string]any{"model": "sim", "messages": []map[string]any{{"role": "user", "content": "hi"}}}, nil))
	a := readSSE(call(t, url, "/v1/chat/completions", map[string]any{"model": "sim", "messages": []map[string]any{{"role": "user", "content": "hi"}},
		"max_tokens": 2, "stream": true, "return_token_ids": true}, nil)).answer()
	if !reflect.DeepEqual(ints(chat["tokens"]), a.promptIDs) {
		t.Fatalf("/tokenize of messages %v, prompt ids of the chat %v", chat["tokens"], a.promptIDs)
	}
	if resp := call(t, url, "/v1/chat/completions", chatBody(map[string]any{"max_tokens": 99}), nil); resp.StatusCode != 400 {
		t.Fatalf("past max_model_len: %d, want 400", resp.StatusCode)
	}
	for _, path := range []string{"/health", "/v1/models", "/sim/requests"} {
		resp, err := http.Get(url + path)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET %s: %v %v", path, resp, err)
		}
		resp.Body.Close()
	}
}

func TestBodyFaultAppliesTimes(t *testing.T) {
	_, url := sim(t, Config{Fault: &Fault{Kind: FaultStatus, Status: 500}, FaultMatch: "NOPE"})
	body := chatBody(map[string]any{"vllmsim_fault": map[string]any{"spec": "503:4", "key": "a", "times": 2}})
	for i, want := range []int{503, 503, 200} {
		resp := call(t, url, "/v1/chat/completions", body, nil)
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d, want %d", i, resp.StatusCode, want)
		}
		if want == 503 && resp.Header.Get("Retry-After") != "4" {
			t.Errorf("Retry-After %q", resp.Header.Get("Retry-After"))
		}
	}
	// --fault-match: the process fault spares requests without the text.
	if resp := call(t, url, "/v1/chat/completions", chatBody(nil), nil); resp.StatusCode != 200 {
		t.Errorf("unmatched request: %d, want 200", resp.StatusCode)
	}
	if resp := call(t, url, "/v1/chat/completions", chatBody(map[string]any{"user": "NOPE"}), nil); resp.StatusCode != 500 {
		t.Errorf("matched request: %d, want 500", resp.StatusCode)
	}
}

func TestGreedyCompletionMatchesTheServer(t *testing.T) {
	_, url := sim(t, Config{Greedy: true})
	m := decode(t, call(t, url, "/v1/completions", map[string]any{"model": "sim", "prompt": "soak 17", "max_tokens": 30}, nil))
	got := m["choices"].([]any)[0].(map[string]any)["text"].(string)
	if want := GreedyCompletion("soak 17", 30); got != want || got == "" {
		t.Fatalf("server %q, GreedyCompletion %q", got, want)
	}
}

// TestAbortCounted: a client that goes away before its first token is an
// aborted generation, on /sim/status and /metrics; one that reads its whole
// answer is not.
func TestAbortCounted(t *testing.T) {
	for _, stream := range []bool{true, false} {
		sim := New(Config{Model: "m", TTFT: time.Hour, Greedy: true})
		srv := httptest.NewServer(sim)
		ctx, cancel := context.WithCancel(t.Context())
		body := `{"model":"m","prompt":"hi","max_tokens":3,"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(body))
		errc := make(chan error, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				_, err = bufio.NewReader(resp.Body).ReadString('\n')
				resp.Body.Close()
			}
			errc <- err
		}()
		waitSim(t, "a running generation", func() bool { return sim.Status().Running == 1 })
		cancel()
		<-errc
		waitSim(t, "the abort", func() bool { st := sim.Status(); return st.Running == 0 && st.Aborted == 1 })
		if sim.Status().LastAbort.IsZero() {
			t.Errorf("stream %v: no abort time", stream)
		}
		resp, err := http.Get(srv.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		resp.Body.Close()
		for _, want := range []string{`vllm:num_requests_running{model_name="m"} 0`, `vllmsim_requests_aborted_total{model_name="m"} 1`} {
			if !strings.Contains(b.String(), want) {
				t.Errorf("stream %v: /metrics lacks %q:\n%s", stream, want, b.String())
			}
		}
		srv.Close()
	}
	sim := New(Config{Model: "m", Greedy: true})
	srv := httptest.NewServer(sim)
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":3,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	resp.Body.Close()
	waitSim(t, "the end", func() bool { return sim.Status().Running == 0 })
	if st := sim.Status(); st.Aborted != 0 {
		t.Errorf("a whole answer counted as aborted: %+v", st)
	}
}

func waitSim(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestRetokenizePrefill: a server that re-tokenizes prefill (as Ollama
// does) continues a long prefill from other ids than it generated: its
// prompt_tokens are not the prompt's plus the tokens so far, and the text
// after the cut differs from the uninterrupted answer. A short prefill
// (the probe's) still continues exactly, and so does the normal server.
func TestRetokenizePrefill(t *testing.T) {
	for _, c := range []struct {
		name  string
		cfg   Config
		cut   int
		exact bool
	}{
		{"normal server", Config{Greedy: true}, 12, true},
		{"re-tokenizing, long prefill", Config{Greedy: true, RetokenizePrefill: 8}, 12, false},
		{"re-tokenizing, short prefill", Config{Greedy: true, RetokenizePrefill: 8}, 4, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, url := sim(t, c.cfg)
			usage := map[string]any{"include_usage": true}
			first := readSSE(call(t, url, "/v1/chat/completions", chatBody(map[string]any{"max_tokens": 24, "return_token_ids": true, "stream_options": usage}), nil)).answer()
			soFar, _ := Detokenize(first.ids[:c.cut])
			pre := chatBody(map[string]any{"max_tokens": 24 - c.cut, "continue_final_message": true, "add_generation_prompt": false, "stream_options": usage,
				"messages": []map[string]any{{"role": "user", "content": "tell me about the river"}, {"role": "assistant", "content": soFar}}})
			rest := readSSE(call(t, url, "/v1/chat/completions", pre, nil)).answer()
			p0 := int(first.usage["prompt_tokens"].(float64))
			gotExact := int(rest.usage["prompt_tokens"].(float64)) == p0+c.cut
			if gotExact != c.exact || (soFar+rest.text == first.text) != c.exact {
				t.Errorf("prompt_tokens %v for %d + %d; text after the cut %q, uninterrupted %q; want exact %v",
					rest.usage["prompt_tokens"], p0, c.cut, rest.text, first.text[len(soFar):], c.exact)
			}
		})
	}
}
