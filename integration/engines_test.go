package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
)

// The OpenAI engine in front of the vLLM simulator: upstream failure
// classes, an SDK chat with tools, readiness, token-exact continuation after
// a kill, seeded choices, prompt limits and Retry-After.

// simProc is a running vLLM simulator (cmd/vllmsim).
type simProc struct {
	*proc
	url string
}

// startSim starts a simulator serving model "sim" with extra args and waits
// until it answers /health.
func startSim(t testing.TB, name string, args ...string) *simProc {
	t.Helper()
	return startSimOn(t, name, freePort(t), args...)
}

// simRecord is a request the simulator received.
type simRecord struct {
	Path  string         `json:"path"`
	Fault string         `json:"fault"`
	Body  map[string]any `json:"body"`
}

func (s *simProc) records(t testing.TB) []simRecord {
	t.Helper()
	var recs []simRecord
	getJSON(t, s.url+"/sim/requests", 200, &recs)
	return recs
}

// generations are the records of real requests: not the workers' probes
// (max_tokens 1, or the user "baton-probe").
func (s *simProc) generations(t testing.TB) []simRecord {
	t.Helper()
	var out []simRecord
	for _, r := range s.records(t) {
		if r.Body["max_tokens"] != 1.0 && r.Body["user"] != "baton-probe" {
			out = append(out, r)
		}
	}
	return out
}

// openaiWorker starts a worker with the OpenAI engine in front of sim,
// serving model "sim".
func (s *stack) openaiWorker(id string, sim *simProc, args ...string) *proc {
	s.t.Helper()
	return s.worker(id, append([]string{"--engine", "openai", "--openai-url", sim.url, "--model", "sim"}, args...)...)
}

func chatRequest(content string, maxTokens int, extra map[string]any) map[string]any {
	b := map[string]any{"model": "sim", "messages": []map[string]any{{"role": "user", "content": content}}, "max_tokens": maxTokens}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

// TestEngineFailureClasses runs each upstream failure of issue 9's table
// through baton and two OpenAI-engine workers sharing one simulator, the
// fault scripted in the request body (vllmsim_fault, passed through): a
// client error reaches the client with the upstream's status, code and
// message and nothing migrates; 429/503/404 migrate as new_request, with
// the upstream's Retry-After in the log; 5xx, cut, malformed and truncated
// streams and a first-token timeout migrate as ongoing_request, and the
// answer equals the fault-free one.
func TestEngineFailureClasses(t *testing.T) {
	t.Parallel()
	sim := startSim(t, "sim", "--greedy", "--token-delay", "5ms")
	s := newStack(t)
	// No local inhibition: each case starts with both workers routable.
	fe := s.frontend([]string{"DYN_RUNTIME_INHIBITED_DURATION_SECS=0"}, "--migration-limit", "3")
	s.openaiWorker("oa1", sim, "--first-token-timeout", "2s")
	s.openaiWorker("oa2", sim, "--first-token-timeout", "2s")
	fe.waitRoutable(t, "oa1", "oa2")

	const maxTokens = 12
	clean := postStream(t, fe.url, "/v1/chat/completions", chatRequest("the failure table", maxTokens,
		map[string]any{"stream_options": map[string]any{"include_usage": true}}), nil, nil)
	if !clean.done || clean.finish != "length" || clean.text == "" {
		t.Fatalf("fault-free run: %+v", clean)
	}
	checkUsage(t, sim, clean, maxTokens)

	for i, tc := range []struct {
		spec      string
		stream    bool
		status    int // client-visible HTTP status; 200: the answer completes
		code      string
		migration string
		class     string
		upStatus  int
		retryMS   int64
		message   string
	}{
		{spec: "policy", stream: true, status: 400, code: "content_policy_violation", class: "client_error", upStatus: 400, message: "safety"},
		{spec: "policy", stream: false, status: 400, code: "content_policy_violation", class: "client_error", upStatus: 400, message: "safety"},
		{spec: "context", stream: true, status: 400, class: "client_error", upStatus: 400, message: "maximum context length"},
		{spec: "429:2", stream: true, status: 200, migration: "new_request", class: "upstream_unavailable", upStatus: 429, retryMS: 2000},
		{spec: "503", stream: false, status: 200, migration: "new_request", class: "upstream_unavailable", upStatus: 503},
		{spec: "404", stream: true, status: 200, migration: "new_request", class: "worker_not_ready", upStatus: 404},
		{spec: "500", stream: true, status: 200, migration: "ongoing_request", upStatus: 500},
		{spec: "500@3", stream: true, status: 200, migration: "ongoing_request", upStatus: 500},
		{spec: "cut@4", stream: true, status: 200, migration: "ongoing_request", message: "read stream"},
		{spec: "malformed@2", stream: true, status: 200, migration: "ongoing_request", message: "malformed"},
		{spec: "nodone@5", stream: true, status: 200, migration: "ongoing_request", message: "without a finish reason"},
		{spec: "stall", stream: true, status: 200, migration: "ongoing_request", message: "first token"},
	} {
		t.Run(fmt.Sprintf("%s stream=%v", tc.spec, tc.stream), func(t *testing.T) {
			fe.waitRoutable(t, "oa1", "oa2") // a 404 takes a worker out until its next probe
			id := fmt.Sprintf("class-%d", i)
			body := chatRequest("the failure table", maxTokens, map[string]any{
				"vllmsim_fault": map[string]any{"spec": tc.spec, "key": id}})
			var status int
			var text, errBody string
			if tc.stream {
				res := postStream(t, fe.url, "/v1/chat/completions", body, map[string]string{"X-Request-Id": id}, nil)
				status, text, errBody = res.status, res.text, res.errorBody
				if tc.status == 200 && (!res.done || res.errorBody != "") {
					t.Fatalf("stream did not complete: %+v", res)
				}
			} else {
				resp := post(t, fe.url+"/v1/chat/completions", body, map[string]string{"X-Request-Id": id})
				var out chatAnswer
				raw := new(strings.Builder)
				_ = json.NewDecoder(teeReader(resp, raw)).Decode(&out)
				resp.Body.Close()
				status, errBody = resp.StatusCode, raw.String()
				if len(out.Choices) > 0 {
					text = out.Choices[0].Message.Content
				}
			}
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, errBody)
			}
			st := fe.state(t, id)
			if tc.status != 200 {
				var e struct {
					Error struct {
						Message, Type, Code string
					} `json:"error"`
				}
				_ = json.Unmarshal([]byte(errBody), &e)
				if (tc.code != "" && e.Error.Code != tc.code) || !strings.Contains(e.Error.Message, tc.message) || e.Error.Type != "invalid_request_error" {
					t.Errorf("error %s, want code %q and a message with %q", errBody, tc.code, tc.message)
				}
				if len(st.Migrations) != 0 || st.Status != "failed" {
					t.Errorf("state %+v, want failed without migrations", st)
				}
			} else {
				if text != clean.text {
					t.Errorf("answer %q, want the fault-free %q", text, clean.text)
				}
				if len(st.Migrations) != 1 || st.Migrations[0].MigrationType != tc.migration {
					t.Errorf("migrations %+v, want one %s", st.Migrations, tc.migration)
				}
			}
			f := st.Attempts[0]
			if f.CloseClass != tc.class || f.CloseStatus != tc.upStatus || f.RetryAfterMS != tc.retryMS || !strings.Contains(f.CloseMessage, tc.message) {
				t.Errorf("attempt 0 failure %+v, want class %q status %d retry %d ms, message with %q", f, tc.class, tc.upStatus, tc.retryMS, tc.message)
			}
		})
	}
	for _, p := range []*proc{s.workers["oa1"], s.workers["oa2"]} {
		if p.Exited() {
			t.Errorf("%s exited: no upstream error may end a worker", p.Name)
		}
	}
}

// checkUsage: the usage chunk is the simulator's count of the prompt and of
// the answer.
func checkUsage(t *testing.T, sim *simProc, res sseResult, completion int) {
	t.Helper()
	var usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	}
	for _, e := range res.events {
		if strings.Contains(e.data, `"usage"`) {
			var c struct {
				Usage *json.RawMessage `json:"usage"`
			}
			_ = json.Unmarshal([]byte(e.data), &c)
			if c.Usage != nil {
				_ = json.Unmarshal(*c.Usage, &usage)
			}
		}
	}
	var tok struct {
		Count int `json:"count"`
	}
	resp := post(t, sim.url+"/tokenize", map[string]any{"model": "sim", "messages": []map[string]any{{"role": "user", "content": "the failure table"}}}, nil)
	_ = json.NewDecoder(resp.Body).Decode(&tok)
	resp.Body.Close()
	if usage.PromptTokens != tok.Count || usage.CompletionTokens != completion || tok.Count == 0 {
		t.Errorf("usage %+v, want the upstream's %d prompt tokens and %d completion tokens", usage, tok.Count, completion)
	}
}

type teeBody struct {
	r interface{ Read([]byte) (int, error) }
	w *strings.Builder
}

func (t teeBody) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	t.w.Write(p[:n])
	return n, err
}

func teeReader(resp *http.Response, w *strings.Builder) teeBody { return teeBody{r: resp.Body, w: w} }

// TestEngineSDKChatWithTools: a streamed chat with tools, tool_choice,
// response_format, stop, seed, temperature, logprobs and vendor extras,
// through the official openai-go SDK, reaches the upstream with every field
// as sent; the tool-call deltas, logprobs, finish reason and usage the
// upstream streamed reach the client; the non-streaming answer and a resume
// from the log say the same; X-Worker-Id names the worker.
func TestEngineSDKChatWithTools(t *testing.T) {
	t.Parallel()
	sim := startSim(t, "sim", "--token-delay", "20ms") // tokens far enough apart to stream as several deltas
	s := newStack(t)
	fe := s.frontend(nil)
	s.openaiWorker("oa1", sim)
	fe.waitRoutable(t, "oa1")

	params := openai.ChatCompletionNewParams{
		Model:    "sim",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("weather in Paris?")},
		Tools: []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: "get_weather", Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}},
		})},
		ToolChoice:     openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("auto")},
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfText: &shared.ResponseFormatTextParam{}},
		Stop:           openai.ChatCompletionNewParamsStopUnion{OfStringArray: []string{"\n\n"}},
		Seed:           openai.Int(7),
		Temperature:    openai.Float(0.8),
		Logprobs:       openai.Bool(true),
		TopLogprobs:    openai.Int(2),
		MaxTokens:      openai.Int(20),
		StreamOptions:  openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
	extras := []option.RequestOption{option.WithJSONSet("top_k", 40), option.WithJSONSet("my_vendor_field", map[string]any{"x": []int{1, 2}})}
	var raw *http.Response
	oc := client(fe.url)
	stream := oc.Chat.Completions.NewStreaming(t.Context(), params,
		append(extras, option.WithHeader("X-Request-Id", "sdk-tools"), option.WithResponseInto(&raw))...)
	var acc openai.ChatCompletionAccumulator
	deltas, logprobs := 0, 0
	for stream.Next() {
		c := stream.Current()
		acc.AddChunk(c)
		for _, ch := range c.Choices {
			deltas += len(ch.Delta.ToolCalls)
			logprobs += len(ch.Logprobs.Content)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	gens := sim.generations(t)
	if len(gens) != 1 || gens[0].Path != "/v1/chat/completions" {
		t.Fatalf("upstream requests %+v, want one chat completion", gens)
	}
	sent := gens[0].Body
	for k, want := range map[string]any{
		"tool_choice": "auto", "response_format": map[string]any{"type": "text"}, "stop": []any{"\n\n"}, "seed": 7.0, "temperature": 0.8,
		"logprobs": true, "top_logprobs": 2.0, "top_k": 40.0, "my_vendor_field": map[string]any{"x": []any{1.0, 2.0}},
		"max_tokens": 20.0, "stream": true, "model": "sim",
	} {
		if got, _ := json.Marshal(sent[k]); string(got) != mustJSON(want) {
			t.Errorf("upstream field %s = %s, want %s", k, got, mustJSON(want))
		}
	}
	if tools, _ := json.Marshal(sent["tools"]); !strings.Contains(string(tools), `"name":"get_weather"`) {
		t.Errorf("upstream tools %s", tools)
	}
	msg := acc.Choices[0].Message
	if len(msg.ToolCalls) != 1 || msg.ToolCalls[0].Function.Name != "get_weather" || !json.Valid([]byte(msg.ToolCalls[0].Function.Arguments)) {
		t.Fatalf("tool calls %+v", msg.ToolCalls)
	}
	if acc.Choices[0].FinishReason != "tool_calls" || deltas < 2 || logprobs == 0 {
		t.Errorf("finish %q, %d tool-call deltas, %d logprobs; want tool_calls, several, some", acc.Choices[0].FinishReason, deltas, logprobs)
	}
	if acc.Usage.PromptTokens == 0 || acc.Usage.CompletionTokens != 8 {
		t.Errorf("usage %+v, want the upstream's", acc.Usage)
	}
	if got := raw.Header.Get("X-Worker-Id"); got != "oa1" {
		t.Errorf("X-Worker-Id %q, want oa1", got)
	}

	// The same request without streaming: the same call, from the same seed.
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{}
	full, err := oc.Chat.Completions.New(t.Context(), params, extras...)
	if err != nil {
		t.Fatal(err)
	}
	if got := full.Choices[0].Message.ToolCalls; len(got) != 1 || got[0].Function.Arguments != msg.ToolCalls[0].Function.Arguments {
		t.Errorf("non-streaming tool calls %+v, want %+v", got, msg.ToolCalls)
	}
	if full.Usage.PromptTokens != acc.Usage.PromptTokens || len(full.Choices[0].Logprobs.Content) != logprobs {
		t.Errorf("non-streaming usage %+v, %d logprobs", full.Usage, len(full.Choices[0].Logprobs.Content))
	}

	// A resume from the log rebuilds the same tool call.
	resp, err := http.Get(fe.url + "/v1/requests/sdk-tools/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var args strings.Builder
	res := readStream(t, resp, func(e sseEvent) {
		var c struct {
			Choices []struct {
				Delta struct {
					ToolCalls []struct {
						Function struct{ Arguments string } `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
			} `json:"choices"`
		}
		_ = json.Unmarshal([]byte(e.data), &c)
		for _, ch := range c.Choices {
			for _, tc := range ch.Delta.ToolCalls {
				args.WriteString(tc.Function.Arguments)
			}
		}
	})
	if !res.done || args.String() != msg.ToolCalls[0].Function.Arguments {
		t.Errorf("resumed arguments %q (done %v), want %q", args.String(), res.done, msg.ToolCalls[0].Function.Arguments)
	}

	// baton replay rebuilds the answer from the log alone.
	out, errOut, code := runTool(t, batonBin, "replay", "--json", "--nats", s.natsURL, "sdk-tools")
	if code != 0 {
		t.Fatalf("replay: exit %d: %s", code, errOut)
	}
	var doc struct {
		Response openai.ChatCompletion `json:"response"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("replay --json: %v", err)
	}
	rm := doc.Response.Choices
	if len(rm) != 1 || len(rm[0].Message.ToolCalls) != 1 || rm[0].Message.ToolCalls[0].Function.Arguments != msg.ToolCalls[0].Function.Arguments ||
		rm[0].FinishReason != "tool_calls" || doc.Response.Usage.PromptTokens != acc.Usage.PromptTokens || len(rm[0].Logprobs.Content) != logprobs {
		t.Errorf("replayed response %+v", doc.Response)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestEngineNotReadyReason: a worker whose upstream refuses it (401) stays
// up but not ready, with the upstream's answer in /v1/workers and /health,
// while a worker with the right key serves.
func TestEngineNotReadyReason(t *testing.T) {
	sim := startSim(t, "sim", "--api-key", "right")
	s := newStack(t)
	fe := s.frontend(nil)
	s.workerEnv = []string{"OPENAI_API_KEY=wrong"}
	bad := s.openaiWorker("bad", sim)
	s.workerEnv = []string{"OPENAI_API_KEY=right"}
	s.openaiWorker("good", sim)
	fe.waitRoutable(t, "good")
	var workers map[string]workerInfo
	waitFor(t, 20*time.Second, "worker bad listed not ready", func() bool {
		workers = map[string]workerInfo{}
		for _, w := range fe.listWorkers(t) {
			workers[w.ID] = w
		}
		return workers["bad"].State == "not_ready"
	})
	if r := workers["bad"].Reason; !strings.Contains(r, "401") || !strings.Contains(r, "Unauthorized") {
		t.Errorf("reason %q, want the upstream's 401", r)
	}
	if c := workers["good"].Capabilities; c["chat"] != true || c["token_ids"] != true || c["prefill"] != true {
		t.Errorf("capabilities of good: %v", c)
	}
	var health struct {
		Status    string `json:"status"`
		Instances []struct {
			WorkerID string `json:"worker_id"`
			Reason   string `json:"reason"`
		} `json:"instances"`
	}
	getJSON(t, fe.url+"/health", 200, &health)
	found := false
	for _, in := range health.Instances {
		found = found || (in.WorkerID == "bad" && strings.Contains(in.Reason, "401"))
	}
	if !found {
		t.Errorf("/health %+v does not give bad's reason", health)
	}
	res := postStream(t, fe.url, "/v1/chat/completions", chatRequest("hello", 5, map[string]any{"temperature": 0}), nil, nil)
	if !res.done || res.header.Get("X-Worker-Id") != "good" {
		t.Errorf("request: done %v on %q, want done on good", res.done, res.header.Get("X-Worker-Id"))
	}
	if bad.Exited() {
		t.Error("worker bad exited; an upstream that refuses it must only make it not ready")
	}
}

// killMidAnswer streams body through fe as request id and SIGKILLs the
// serving worker once afterTokens tokens arrived; before, if set, runs
// first (while the stream waits).
func killMidAnswer(t *testing.T, s *stack, fe *frontend, id string, body map[string]any, afterTokens int, before func()) (sseResult, string) {
	t.Helper()
	var once sync.Once
	var killed string
	res := postStream(t, fe.url, "/v1/chat/completions", body, map[string]string{"X-Request-Id": id}, func(e sseEvent) {
		if n, err := strconv.Atoi(e.id); err == nil && n >= afterTokens {
			once.Do(func() {
				if before != nil {
					before()
				}
				killed = fe.servingWorker(t, id)
				s.workers[killed].signal(syscall.SIGKILL)
			})
		}
	})
	return res, killed
}

// killWithNoContinuation streams body as request id from oa1, the only
// worker, starts oa2 in front of next once 5 tokens came, then kills oa1:
// next cannot continue the answer, so the stream must end with an error
// event that says why (want) and no [DONE], and next must never have been
// sent a prefill.
func killWithNoContinuation(t *testing.T, s *stack, fe *frontend, next *simProc, id string, body map[string]any, want string) {
	t.Helper()
	res, killed := killMidAnswer(t, s, fe, id, body, 5, func() {
		s.openaiWorker("oa2", next)
		fe.waitRoutable(t, "oa2")
	})
	if killed != "oa1" {
		t.Fatalf("served by %q, want oa1", killed)
	}
	if res.done || !strings.Contains(res.errorBody, want) {
		t.Fatalf("done %v, error %q; want an error event saying %q and no [DONE]", res.done, res.errorBody, want)
	}
	for _, g := range next.generations(t) {
		if g.Body["continue_final_message"] == true {
			t.Errorf("%s, which cannot continue the answer, was sent a prefill: %v", next.Name, g.Body)
		}
	}
}

// direct is the simulator's own answer to body: what a fault-free run says.
func direct(t *testing.T, sim *simProc, body map[string]any) string {
	t.Helper()
	return directAsync(sim, body)(t)
}

// directAsync asks sim for its own answer to body while the caller goes on
// (the answer takes as long as the stream it is compared with, at the
// simulator's token delay, so a test can start its stack meanwhile); the
// function it returns waits for the answer, failing t if there is none.
func directAsync(sim *simProc, body map[string]any) func(t *testing.T) string {
	type answer struct {
		text string
		err  error
	}
	ch := make(chan answer, 1)
	go func() {
		text, err := directAnswer(sim, body)
		ch <- answer{text, err}
	}()
	return func(t *testing.T) string {
		t.Helper()
		a := <-ch
		if a.err != nil {
			t.Fatalf("direct answer: %v", a.err)
		}
		return a.text
	}
}

// chatAnswer is what the tests read of a chat completion: its choices'
// messages.
type chatAnswer struct {
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
}

func directAnswer(sim *simProc, body map[string]any) (string, error) {
	b := maps.Clone(body)
	b["stream"] = false
	data, _ := json.Marshal(b)
	resp, err := http.Post(sim.url+"/v1/chat/completions", "application/json", bytes.NewReader(data))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out chatAnswer
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", fmt.Errorf("status %d: %w", resp.StatusCode, err)
	}
	if len(out.Choices) == 0 {
		return "", fmt.Errorf("status %d: no choices", resp.StatusCode)
	}
	return out.Choices[0].Message.Content, nil
}

// TestEngineKillContinuesTokenExact: kill -9 of the serving worker mid-answer
// of a seeded chat at temperature > 0. The second worker's request carries
// the prompt's ids plus the generated ids (no re-templating, no
// re-tokenization) with the same sampling parameters, for the remaining
// budget, and the answer equals the fault-free one token for token. Without
// token ids (--no-token-ids) the continuation is assistant prefill, and the
// answer is the same too.
func TestEngineKillContinuesTokenExact(t *testing.T) {
	t.Parallel() // waits on the simulators' token delays, not on the CPU
	for _, tc := range []struct {
		name string
		args []string
	}{
		{name: "token ids"},
		{name: "prefill", args: []string{"--no-token-ids"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sims := map[string]*simProc{
				"oa1": startSim(t, "sim-a", append([]string{"--token-delay", "40ms"}, tc.args...)...),
				"oa2": startSim(t, "sim-b", append([]string{"--token-delay", "40ms"}, tc.args...)...),
			}
			const maxTokens = 30
			body := chatRequest("tell me a long story about rivers", maxTokens, map[string]any{"seed": 7, "temperature": 1.1})
			faultFree := directAsync(sims["oa1"], body) // while the stack starts
			s := newStack(t)
			fe := s.frontend(nil, "--migration-limit", "2")
			s.openaiWorker("oa1", sims["oa1"])
			s.openaiWorker("oa2", sims["oa2"])
			fe.waitRoutable(t, "oa1", "oa2")
			want := faultFree(t) // before the stream, so that it is no generation of the stream's
			res, killed := killMidAnswer(t, s, fe, "kill-"+strings.ReplaceAll(tc.name, " ", "-"), body, 8, nil)
			if !res.done || res.errorBody != "" || res.text != want {
				t.Fatalf("answer after the kill (done %v, error %s):\n got %q\nwant %q", res.done, res.errorBody, res.text, want)
			}
			checkIDs(t, res, 0)
			st := fe.state(t, res.requestID)
			if len(st.Migrations) != 1 || st.Migrations[0].MigrationType != "ongoing_request" {
				t.Fatalf("migrations %+v, want one ongoing_request", st.Migrations)
			}
			cut := st.Migrations[0].Offset
			survivor := "oa1"
			if killed == "oa1" {
				survivor = "oa2"
			}
			gens := sims[survivor].generations(t)
			cont := gens[len(gens)-1].Body
			if cont["seed"] != 7.0 || cont["temperature"] != 1.1 || cont["max_tokens"] != float64(maxTokens-cut) {
				t.Errorf("continuation parameters: %v", cont)
			}
			if tc.args == nil {
				var tok struct {
					Count int `json:"count"`
				}
				resp := post(t, sims[survivor].url+"/tokenize", map[string]any{"model": "sim", "messages": body["messages"]}, nil)
				_ = json.NewDecoder(resp.Body).Decode(&tok)
				resp.Body.Close()
				ids, _ := cont["prompt"].([]any)
				if gens[len(gens)-1].Path != "/v1/completions" || len(ids) != tok.Count+cut || cont["messages"] != nil {
					t.Errorf("continuation %s with a prompt of %d ids, want /v1/completions with %d prompt ids + %d generated", gens[len(gens)-1].Path, len(ids), tok.Count, cut)
				}
			} else {
				msgs, _ := cont["messages"].([]any)
				last, _ := msgs[len(msgs)-1].(map[string]any)
				if cont["continue_final_message"] != true || cont["add_generation_prompt"] != false || last["role"] != "assistant" || !strings.HasPrefix(want, last["content"].(string)) {
					t.Errorf("prefill continuation %v", cont)
				}
			}
		})
	}
}

// TestEngineNoWorkerCanContinue: when the only other worker's upstream
// rejects prefill and has no token ids, a migrated request cannot continue
// there: it fails cleanly (an error event, no [DONE], the reason in the log)
// with migration budget left, and the fallback is never sent a prefill.
func TestEngineNoWorkerCanContinue(t *testing.T) {
	t.Parallel() // waits on the simulators' token delays, not on the CPU
	simA := startSim(t, "sim-a", "--token-delay", "40ms", "--no-token-ids")
	simB := startSim(t, "sim-b", "--token-delay", "40ms", "--no-token-ids", "--reject-prefill")
	s := newStack(t)
	fe := s.frontend(nil, "--migration-limit", "3")
	s.openaiWorker("oa1", simA)
	fe.waitRoutable(t, "oa1")
	// 300 tokens take oa1 12 s: the kill comes mid-answer however long oa2
	// takes to start while the stream waits (30 once ended before it, on a
	// loaded machine). Nothing after the kill is generated.
	body := chatRequest("tell me a long story about rivers", 300, map[string]any{"seed": 3, "temperature": 0.9})
	killWithNoContinuation(t, s, fe, simB, "no-continue", body, "continue")
	st := fe.state(t, "no-continue")
	if st.Status != "failed" || st.Error == nil || !strings.Contains(st.Error.Message, "continue") {
		t.Errorf("state %+v, want failed with the reason", st)
	}
}

// TestEngineSeededChoices: n = 2 with a seed runs two children that ask the
// server for one choice each, with seed and seed + 1: the choices differ and
// each is the server's own answer for its seed.
func TestEngineSeededChoices(t *testing.T) {
	sim := startSim(t, "sim")
	s := newStack(t)
	fe := s.frontend(nil)
	s.openaiWorker("oa1", sim)
	fe.waitRoutable(t, "oa1")
	body := chatRequest("two stories", 12, map[string]any{"seed": 40, "temperature": 1.3, "n": 2})
	resp := post(t, fe.url+"/v1/chat/completions", body, nil)
	defer resp.Body.Close()
	var out chatAnswer
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) != 2 {
		t.Fatalf("answer %+v: %v", out, err)
	}
	for i, c := range out.Choices {
		one := chatRequest("two stories", 12, map[string]any{"seed": 40 + i, "temperature": 1.3})
		if want := direct(t, sim, one); c.Message.Content != want {
			t.Errorf("choice %d: %q, want the server's answer for seed %d: %q", i, c.Message.Content, 40+i, want)
		}
	}
	if out.Choices[0].Message.Content == out.Choices[1].Message.Content {
		t.Error("the two seeded choices are the same")
	}
	for _, g := range sim.generations(t) {
		if g.Body["n"] != nil && g.Body["n"] != 1.0 {
			t.Errorf("the server was asked for n = %v", g.Body["n"])
		}
	}
}

// TestEnginePromptLimitInServerTokens: --max-prompt-tokens admits a prompt
// of few words, but the model server counts more tokens: the client gets
// 413 before any token, and nothing migrates.
func TestEnginePromptLimitInServerTokens(t *testing.T) {
	t.Parallel()
	sim := startSim(t, "sim")
	s := newStack(t)
	fe := s.frontend(nil, "--max-prompt-tokens", "20", "--migration-limit", "2")
	s.openaiWorker("oa1", sim)
	s.openaiWorker("oa2", sim)
	fe.waitRoutable(t, "oa1", "oa2")
	res := postStream(t, fe.url, "/v1/chat/completions", chatRequest("qqqqqqqqqqqq qqqqqqqqqqqq", 5, nil), map[string]string{"X-Request-Id": "long-prompt"}, nil)
	if res.status != 413 || !strings.Contains(res.errorBody, "prompt_too_large") || !strings.Contains(res.errorBody, "model server") {
		t.Fatalf("status %d %s, want 413 prompt_too_large in the server's count", res.status, res.errorBody)
	}
	if st := fe.state(t, "long-prompt"); len(st.Migrations) != 0 || st.Status != "failed" {
		t.Errorf("state %+v, want failed without a migration", st)
	}
}

// TestEngineRetryAfterInhibits: a 429 with Retry-After 4 s keeps its worker
// out of this frontend's routing for 4 s, longer than the default
// inhibition (1 s here), and then it serves again.
func TestEngineRetryAfterInhibits(t *testing.T) {
	sim := startSim(t, "sim", "--greedy")
	s := newStack(t)
	fe := s.frontend([]string{"DYN_RUNTIME_INHIBITED_DURATION_SECS=1"}, "--migration-limit", "2")
	s.openaiWorker("oa1", sim)
	s.openaiWorker("oa2", sim)
	fe.waitRoutable(t, "oa1", "oa2")
	res := postStream(t, fe.url, "/v1/chat/completions", chatRequest("busy", 4, map[string]any{
		"vllmsim_fault": map[string]any{"spec": "429:4", "key": "ra"}}), map[string]string{"X-Request-Id": "ra"}, nil)
	failedAt := time.Now()
	if !res.done {
		t.Fatalf("request did not complete: %+v", res)
	}
	st := fe.state(t, "ra")
	inhibited, other := st.Attempts[0].WorkerID, res.header.Get("X-Worker-Id")
	if inhibited == other || st.Attempts[0].RetryAfterMS != 4000 {
		t.Fatalf("attempts %+v, served by %s", st.Attempts, other)
	}
	// Requests for 2.5 s after the 429 (past the 1 s default) all avoid it.
	n := 0
	for time.Since(failedAt) < 2500*time.Millisecond {
		r := postStream(t, fe.url, "/v1/chat/completions", chatRequest("after", 2, nil), nil, nil)
		if got := r.header.Get("X-Worker-Id"); got != other {
			t.Fatalf("request %d, %v after the 429, went to %q; want %s (%s is inhibited for 4 s)", n, time.Since(failedAt), got, other, inhibited)
		}
		n++
	}
	waitFor(t, 20*time.Second, inhibited+" serving again after the Retry-After", func() bool {
		r := postStream(t, fe.url, "/v1/chat/completions", chatRequest("later", 2, nil), nil, nil)
		return r.header.Get("X-Worker-Id") == inhibited
	})
}
