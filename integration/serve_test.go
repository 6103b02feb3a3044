package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// Serving the OpenAI API: streaming equals unary, SSE ids, a request's
// state, bad input beside a good stream, and one client id sent to two
// frontends at once.

// startBasic starts NATS, one frontend and two fast mock workers.
func startBasic(t *testing.T, frontendArgs ...string) (*stack, *frontend) {
	t.Helper()
	s := newStack(t)
	fe := s.frontend(nil, frontendArgs...)
	s.worker("w1", "--mock-speedup-ratio", "20")
	s.worker("w2", "--mock-speedup-ratio", "20")
	fe.waitRoutable(t, "w1", "w2")
	return s, fe
}

// oneWorker starts a stack of one frontend with frontendArgs and one worker,
// w1, with workerArgs, and waits until the frontend can route to it.
func oneWorker(t testing.TB, workerArgs []string, frontendArgs ...string) (*stack, *frontend) {
	t.Helper()
	s := newStack(t)
	f := s.frontend(nil, frontendArgs...)
	s.worker("w1", workerArgs...)
	f.waitRoutable(t, "w1")
	return s, f
}

func client(url string) openai.Client {
	return openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
}

// TestOpenAISDKStreamingEqualsUnary drives the stack with the official
// OpenAI Go SDK: the streamed text equals the non-streamed text for the same
// prompt, on both endpoints, and the usage adds up.
func TestOpenAISDKStreamingEqualsUnary(t *testing.T) {
	_, fe := startBasic(t)
	c := client(fe.url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	chat := openai.ChatCompletionNewParams{
		Model:     "mock",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("tell me about fault tolerance")},
		MaxTokens: openai.Int(40),
	}
	unary, err := c.Chat.Completions.New(ctx, chat)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	if got := len(strings.Fields(unary.Choices[0].Message.Content)); got != 40 {
		t.Fatalf("chat tokens = %d, want 40", got)
	}
	if unary.Usage.CompletionTokens != 40 || unary.Usage.PromptTokens != 6 {
		t.Errorf("usage = %+v, want 6 prompt (\"user: tell me about fault tolerance\") and 40 completion tokens", unary.Usage)
	}
	chat.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Chat.Completions.NewStreaming(ctx, chat)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("chat stream: %v", err)
	}
	if got, want := acc.Choices[0].Message.Content, unary.Choices[0].Message.Content; got != want {
		t.Errorf("streamed chat text differs from unary:\n got %q\nwant %q", got, want)
	}
	if acc.Usage.CompletionTokens != 40 {
		t.Errorf("streamed usage = %+v, want 40 completion tokens", acc.Usage)
	}
	if acc.Choices[0].FinishReason != "length" {
		t.Errorf("finish reason = %q, want length", acc.Choices[0].FinishReason)
	}

	comp := openai.CompletionNewParams{
		Model:     "mock",
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon a time")},
		MaxTokens: openai.Int(25),
	}
	cu, err := c.Completions.New(ctx, comp)
	if err != nil {
		t.Fatalf("completion: %v", err)
	}
	cs := c.Completions.NewStreaming(ctx, comp)
	var text strings.Builder
	for cs.Next() {
		for _, ch := range cs.Current().Choices {
			text.WriteString(ch.Text)
		}
	}
	if err := cs.Err(); err != nil {
		t.Fatalf("completion stream: %v", err)
	}
	if text.String() != cu.Choices[0].Text || len(strings.Fields(cu.Choices[0].Text)) != 25 {
		t.Errorf("completion stream %q != unary %q (want 25 tokens)", text.String(), cu.Choices[0].Text)
	}
}

// TestSSEIDsAreTokenOffsets checks the raw stream: every event has an id, the
// ids are the token offsets after each chunk, and the stream ends with [DONE].
func TestSSEIDsAreTokenOffsets(t *testing.T) {
	_, fe := startBasic(t)
	res := postStream(t, fe.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "a b c", "max_tokens": 50}, nil, nil)
	if res.status != 200 || res.requestID == "" {
		t.Fatalf("status %d, request id %q: %s", res.status, res.requestID, res.errorBody)
	}
	if !res.done || res.finish != "length" {
		t.Fatalf("done=%v finish=%q, want [DONE] and length", res.done, res.finish)
	}
	checkIDs(t, res, 0)
	if last := res.events[len(res.events)-1].id; last != "50" {
		t.Errorf("last id = %s, want 50", last)
	}
	// The same prompt always yields the same text (the mock is deterministic).
	again := postStream(t, fe.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "a b c", "max_tokens": 50}, nil, nil)
	if again.text != res.text {
		t.Errorf("two runs differ:\n%q\n%q", res.text, again.text)
	}
}

// TestRequestStateAndDiscovery checks GET /v1/requests/{id}, /v1/models,
// /v1/workers, /health and /live.
func TestRequestStateAndDiscovery(t *testing.T) {
	_, fe := startBasic(t)
	res := postStream(t, fe.url, "/v1/chat/completions", map[string]any{
		"model": "mock", "messages": []map[string]any{{"role": "user", "content": "hello there"}}, "max_tokens": 10,
	}, map[string]string{"X-Request-Id": "state-1"}, nil)
	if res.requestID != "state-1" || !res.done {
		t.Fatalf("request id %q done %v: %s", res.requestID, res.done, res.errorBody)
	}
	var state struct {
		ID              string `json:"id"`
		Status          string `json:"status"`
		Model           string `json:"model"`
		Worker          string `json:"worker"`
		Owner           string `json:"owner"`
		TokensGenerated int    `json:"tokens_generated"`
		FinishReason    string `json:"finish_reason"`
		Attempts        []any  `json:"attempts"`
	}
	getJSON(t, fe.url+"/v1/requests/state-1", 200, &state)
	if state.Status != "completed" || state.TokensGenerated != 10 || state.FinishReason != "length" ||
		state.Model != "mock" || state.Owner != "frontend-1" || len(state.Attempts) != 1 ||
		(state.Worker != "w1" && state.Worker != "w2") {
		t.Errorf("state = %+v", state)
	}
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	getJSON(t, fe.url+"/v1/models", 200, &models)
	if len(models.Data) != 1 || models.Data[0].ID != "mock" {
		t.Errorf("models = %+v", models)
	}
	ws, err := fe.workers()
	if err != nil || len(ws) != 2 || ws[0].PID == 0 {
		t.Errorf("workers = %+v, %v", ws, err)
	}
	var health struct {
		Status    string `json:"status"`
		Instances []any  `json:"instances"`
	}
	getJSON(t, fe.url+"/health", 200, &health)
	if health.Status != "healthy" || len(health.Instances) != 2 {
		t.Errorf("health = %+v", health)
	}
	var live map[string]string
	getJSON(t, fe.url+"/live", 200, &live)
	if live["status"] != "live" {
		t.Errorf("live = %v", live)
	}
	if got := fe.metric(t, "dynamo_frontend_requests_total", "model", "mock", "request_type", "stream", "status", "success"); got != 1 {
		t.Errorf("requests_total{stream,success} = %v, want 1", got)
	}
	if got := fe.metric(t, "dynamo_frontend_output_tokens_total", "model", "mock"); got != 10 {
		t.Errorf("output_tokens_total = %v, want 10", got)
	}
}

// getJSON decodes GET url's body into v, failing the test unless the
// status is wantStatus.
func getJSON(t testing.TB, url string, wantStatus int, v any) {
	t.Helper()
	code, body := httpGet(t, url)
	if code != wantStatus {
		t.Fatalf("GET %s: status %d, want %d: %s", url, code, wantStatus, body)
	}
	decodeBody(t, url, body, v)
}

// getDecoded decodes GET url's body into v, whatever its status, and
// returns the status (a /health answers 503 with the same body).
func getDecoded(t testing.TB, url string, v any) int {
	t.Helper()
	code, body := httpGet(t, url)
	decodeBody(t, url, body, v)
	return code
}

// httpGet is GET url's status and body.
func httpGet(t testing.TB, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read the body: %v", url, err)
	}
	return resp.StatusCode, body
}

func decodeBody(t testing.TB, url string, body []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, body)
	}
}

// TestBadInput sends malformed and invalid requests while a good stream is
// running: each gets an OpenAI-style error body with the right status and an
// X-Request-Id, and the good stream is undisturbed.
func TestBadInput(t *testing.T) {
	_, fe := startBasic(t)
	var wg sync.WaitGroup
	var good sseResult
	wg.Add(1)
	go func() {
		defer wg.Done()
		good = postStream(t, fe.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "still fine", "max_tokens": 200}, nil, nil)
	}()
	huge := strings.Repeat("word ", 40000)
	for _, c := range []struct {
		name, path, body string
		header           map[string]string
		status           int
		code             string
	}{
		{"malformed json", "/v1/chat/completions", `{"model": "mock", "messages": [`, nil, 400, "invalid_json"},
		{"not an object", "/v1/chat/completions", `[1,2,3]`, nil, 400, "invalid_type"},
		{"trailing data", "/v1/completions", `{"model":"mock","prompt":"a"} {}`, nil, 400, "invalid_json"},
		{"wrong type max_tokens", "/v1/completions", `{"model":"mock","prompt":"a","max_tokens":"ten"}`, nil, 400, "invalid_type"},
		{"wrong type model", "/v1/completions", `{"model":5,"prompt":"a"}`, nil, 400, "invalid_type"},
		{"missing model", "/v1/completions", `{"prompt":"a"}`, nil, 400, "missing_model"},
		{"missing messages", "/v1/chat/completions", `{"model":"mock"}`, nil, 400, "missing_messages"},
		{"empty messages", "/v1/chat/completions", `{"model":"mock","messages":[]}`, nil, 400, "invalid_value"},
		{"bad role", "/v1/chat/completions", `{"model":"mock","messages":[{"role":"wizard","content":"x"}]}`, nil, 400, "invalid_value"},
		{"missing prompt", "/v1/completions", `{"model":"mock"}`, nil, 400, "missing_prompt"},
		{"token prompt", "/v1/completions", `{"model":"mock","prompt":[1,2,3]}`, nil, 400, "invalid_type"},
		{"negative max_tokens", "/v1/completions", `{"model":"mock","prompt":"a","max_tokens":-5}`, nil, 400, "invalid_value"},
		{"zero max_tokens", "/v1/completions", `{"model":"mock","prompt":"a","max_tokens":0}`, nil, 400, "invalid_value"},
		{"huge max_tokens", "/v1/completions", `{"model":"mock","prompt":"a","max_tokens":100000000}`, nil, 400, "invalid_value"},
		{"overflowing max_tokens", "/v1/completions", `{"model":"mock","prompt":"a","max_tokens":1e30}`, nil, 400, "invalid_type"},
		{"bad n", "/v1/completions", `{"model":"mock","prompt":"a","n":0}`, nil, 400, "invalid_value"},
		{"unknown model", "/v1/completions", `{"model":"gpt-9","prompt":"a"}`, nil, 404, "model_not_found"},
		{"prompt too large", "/v1/completions", `{"model":"mock","prompt":"` + huge + `"}`, nil, 413, "prompt_too_large"},
		{"body too large", "/v1/completions", `{"model":"mock","prompt":"` + strings.Repeat("x", 2<<20) + `"}`, nil, 413, "request_too_large"},
		{"bad request id", "/v1/completions", `{"model":"mock","prompt":"a"}`, map[string]string{"X-Request-Id": "no spaces allowed"}, 400, "invalid_request_id"},
		{"unknown parent", "/v1/completions", `{"model":"mock","prompt":"a"}`, map[string]string{"X-Parent-Request-Id": "nobody"}, 404, "parent_not_found"},
		{"unknown pinned worker", "/v1/completions", `{"model":"mock","prompt":"a"}`, map[string]string{"X-Worker-Id": "w9"}, 404, "worker_not_found"},
		{"bad Last-Event-ID", "/v1/completions", `{"model":"mock","prompt":"a"}`, map[string]string{"Last-Event-ID": "x"}, 400, "invalid_offset"},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, fe.url+c.path, bytes.NewReader([]byte(c.body)))
			req.Header.Set("Content-Type", "application/json")
			for k, v := range c.header {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			checkErrorResponse(t, resp, c.status, c.code)
		})
	}
	for _, c := range []struct {
		name, method, path string
		status             int
		code               string
	}{
		{"unknown request", "GET", "/v1/requests/nope", 404, "request_not_found"},
		{"unknown resume", "GET", "/v1/requests/nope/stream", 404, "request_not_found"},
		{"unknown cancel", "POST", "/v1/requests/nope/cancel", 404, "request_not_found"},
		{"unknown route", "GET", "/v2/whatever", 404, "not_found"},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, fe.url+c.path, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			checkErrorResponse(t, resp, c.status, c.code)
		})
	}
	wg.Wait()
	checkComplete(t, good, "still fine", 200)
}

func checkErrorResponse(t *testing.T, resp *http.Response, status int, code string) {
	t.Helper()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, body)
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error body: %s", body)
	}
	if e.Error.Code != code {
		t.Errorf("code %q, want %q (%s)", e.Error.Code, code, e.Error.Message)
	}
	if resp.Header.Get("X-Request-Id") == "" && strings.HasPrefix(resp.Request.URL.Path, "/v1/") {
		t.Errorf("no X-Request-Id header")
	}
}

// TestSameIDRaceKeepsTheRunningAttempt: a client's id sent to two
// frontends at once. Each frontend dispatches the request while it appends
// its accepted event (the held dispatch, docs/internals.md); one append
// wins, and the other frontend fences its own dispatch by its hold id and
// serves the winner's request. With one worker both dispatches reach the
// same worker for the same attempt: the fence must not end the attempt the
// winner's dispatch started. Every pair of clients gets the same whole
// answer, each request ran in one attempt with no migration, and the worker
// stays in service with nothing of its output taken for junk.
func TestSameIDRaceKeepsTheRunningAttempt(t *testing.T) {
	s := newStack(t)
	f1, f2 := s.frontend(nil), s.frontend(nil)
	s.worker("w1", "--mock-tokens-per-sec", "400")
	f1.waitRoutable(t, "w1")
	f2.waitRoutable(t, "w1")
	const ids = 30
	for i := range ids {
		id := fmt.Sprintf("race-%d", i)
		body := map[string]any{"model": "mock", "prompt": "same id " + id, "max_tokens": 24}
		var wg sync.WaitGroup
		var res [2]sseResult
		start := make(chan struct{})
		for k, f := range []*frontend{f1, f2} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b := map[string]any{}
				for key, v := range body {
					b[key] = v
				}
				<-start
				res[k] = postStream(t, f.url, "/v1/completions", b, map[string]string{"X-Request-Id": id}, nil)
			}()
		}
		close(start)
		wg.Wait()
		for k, r := range res {
			if r.status != 200 || !r.done || r.errorBody != "" {
				t.Fatalf("%s through frontend %d: status %d done %v error %s", id, k+1, r.status, r.done, r.errorBody)
			}
		}
		if res[0].text != res[1].text || res[0].text == "" {
			t.Fatalf("%s: the two clients got %q and %q", id, res[0].text, res[1].text)
		}
		var st requestState
		getJSON(t, f1.url+"/v1/requests/"+id, 200, &st)
		if st.Status != "completed" || len(st.Attempts) != 1 || len(st.Migrations) != 0 {
			t.Fatalf("%s: %+v, want completed in one attempt with no migration", id, st)
		}
	}
	abandoned := strings.Count(f1.output(), "abandoned a held dispatch") + strings.Count(f2.output(), "abandoned a held dispatch")
	if abandoned == 0 {
		t.Errorf("no frontend lost a race in %d pairs: the test did not exercise the fence", ids)
	}
	t.Logf("%d of %d races lost by a frontend that had dispatched", abandoned, ids)
	for _, f := range []*frontend{f1, f2} {
		if n := f.metric(t, "baton_log_workers_quarantined_total"); n != 0 {
			t.Errorf("%s quarantined %v workers", f.url, n)
		}
	}
	if n := f1.metric(t, "dynamo_frontend_model_migration_total") + f2.metric(t, "dynamo_frontend_model_migration_total"); n != 0 {
		t.Errorf("%v migrations, want none", n)
	}
}
