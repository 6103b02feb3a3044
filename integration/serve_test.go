package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

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

func getJSON(t testing.TB, url string, wantStatus int, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != wantStatus {
		t.Fatalf("GET %s: status %d, want %d: %s", url, resp.StatusCode, wantStatus, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, body)
	}
}
