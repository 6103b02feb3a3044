package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/baton-dev/baton/services/engine"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// The Responses API (issue 20), through the official openai-go SDK where it
// applies and raw HTTP where the test needs the bytes.

// respEvents is a response's stream as a client read it.
type respEvents struct {
	seqs  []int64
	types []string
	raw   []string // each event's JSON
	text  string   // the output_text deltas joined
	last  responses.ResponseStreamEventUnion
	err   error
}

// readResponseStream reads stream to its end, calling onEvent (if set) on
// every event; onEvent returning false stops reading.
func readResponseStream(stream interface {
	Next() bool
	Current() responses.ResponseStreamEventUnion
	Err() error
	Close() error
}, onEvent func(responses.ResponseStreamEventUnion) bool) respEvents {
	var r respEvents
	defer stream.Close()
	for stream.Next() {
		ev := stream.Current()
		r.seqs = append(r.seqs, ev.SequenceNumber)
		r.types = append(r.types, ev.Type)
		r.raw = append(r.raw, ev.RawJSON())
		if ev.Type == "response.output_text.delta" {
			r.text += ev.Delta
		}
		r.last = ev
		if onEvent != nil && !onEvent(ev) {
			return r
		}
	}
	r.err = stream.Err()
	return r
}

// contiguous checks that seqs run from first on, one by one.
func contiguous(t *testing.T, what string, seqs []int64, first int64) {
	t.Helper()
	for i, s := range seqs {
		if s != first+int64(i) {
			t.Fatalf("%s: sequence_number %d at position %d, want %d (all: %v)", what, s, i, first+int64(i), seqs)
		}
	}
}

func sdk(url, key string) *openai.Client {
	if key == "" {
		key = "unused"
	}
	c := openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey(key), option.WithMaxRetries(0))
	return &c
}

// createBackground creates a background response to question on the
// frontend at url, failing the test if it is refused.
func createBackground(t *testing.T, url, question string) *responses.Response {
	t.Helper()
	created, err := sdk(url, "").Responses.New(context.Background(), responses.ResponseNewParams{
		Model: "mock", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(question)},
		Background: openai.Bool(true),
	})
	if err != nil {
		t.Fatalf("create %q: %v", question, err)
	}
	return created
}

// rawJSON decodes s as JSON, for comparisons that ignore key order.
func rawJSON(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%v: %s", err, s)
	}
	return v
}

// getResponse is GET /v1/responses/{id} as JSON.
func getResponse(t *testing.T, c apiClient, id string) map[string]any {
	t.Helper()
	res := c.get(t, "/v1/responses/"+id)
	res.want(t, "GET "+id, 200, "")
	var obj map[string]any
	if err := json.Unmarshal(res.body, &obj); err != nil {
		t.Fatal(err)
	}
	return obj
}

// wantParam checks a 400 invalid_request_error naming param.
func wantParam(t *testing.T, what string, res apiResult, param string) {
	t.Helper()
	var e struct {
		Error struct {
			Type  string  `json:"type"`
			Param *string `json:"param"`
		} `json:"error"`
	}
	_ = json.Unmarshal(res.body, &e)
	if res.status != 400 || e.Error.Type != "invalid_request_error" || e.Error.Param == nil || *e.Error.Param != param {
		t.Errorf("%s: got %d %s, want 400 invalid_request_error with param %q", what, res.status, res.body, param)
	}
}

// TestResponsesStreamed: a streamed create has contiguous sequence numbers
// from 0, ends with response.completed whose object equals a GET, and says
// what the chat path says for the same input; a resume from 0, from none
// and from the last event replays exactly; input_items, max_output_tokens,
// bad input and DELETE.
func TestResponsesStreamed(t *testing.T) {
	_, fe := startBasic(t)
	ctx := context.Background()
	c := sdk(fe.url, "")
	api := apiClient{url: fe.url}
	question := "what makes a log durable"
	res := readResponseStream(c.Responses.NewStreaming(ctx, responses.ResponseNewParams{
		Model: "mock", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(question)},
	}), nil)
	if res.err != nil {
		t.Fatalf("stream: %v", res.err)
	}
	contiguous(t, "create", res.seqs, 0)
	if res.types[0] != "response.created" || res.types[1] != "response.in_progress" || res.last.Type != "response.completed" {
		t.Fatalf("events %v", res.types)
	}
	id := res.last.Response.ID
	if res.last.Response.Status != "completed" || res.last.Response.OutputText() != res.text {
		t.Errorf("final: status %q, output text %q, deltas %q", res.last.Response.Status, res.last.Response.OutputText(), res.text)
	}
	if want := engine.MockText("user: "+question, 0, 64); res.text != want {
		t.Errorf("text %q, want the mock's %q", res.text, want)
	}
	chat, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "mock", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(question)},
	})
	if err != nil || chat.Choices[0].Message.Content != res.text {
		t.Errorf("chat's answer %v differs from the response's %q", err, res.text)
	}
	final := rawJSON(t, res.last.RawJSON()).(map[string]any)["response"]
	if got := getResponse(t, api, id); !reflect.DeepEqual(any(got), final) {
		t.Errorf("GET differs from the final event's response:\n GET %v\nfinal %v", got, final)
	}

	// Resumes: from none (every event), after 0, after the last (nothing).
	for _, after := range []int64{-1, 0, int64(len(res.seqs) - 1)} {
		q := responses.ResponseGetParams{}
		if after >= 0 {
			q.StartingAfter = openai.Int(after)
		}
		again := readResponseStream(c.Responses.GetStreaming(ctx, id, q), nil)
		if again.err != nil {
			t.Fatalf("resume after %d: %v", after, again.err)
		}
		contiguous(t, "resume", again.seqs, after+1)
		if want := res.raw[after+1:]; !reflect.DeepEqual(again.raw, want) && !(len(want) == 0 && len(again.raw) == 0) {
			t.Errorf("resume after %d: %d events differ from the original's %d", after, len(again.raw), len(want))
		}
	}
	wantParam(t, "past the end", api.get(t, "/v1/responses/"+id+"?stream=true&starting_after=999"), "starting_after")

	items, err := c.Responses.InputItems.List(ctx, id, responses.InputItemListParams{})
	if err != nil || len(items.Data) != 1 || items.Data[0].Role != "user" {
		t.Errorf("input_items: %v %+v", err, items)
	}

	// max_output_tokens ends it as incomplete.
	short, err := c.Responses.New(ctx, responses.ResponseNewParams{
		Model: "mock", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(question)},
		MaxOutputTokens: openai.Int(5),
	})
	if err != nil || short.Status != "incomplete" || short.IncompleteDetails.Reason != "max_output_tokens" || short.Usage.OutputTokens != 5 {
		t.Errorf("max_output_tokens 5: %v, status %q, incomplete %q, usage %+v", err, short.Status, short.IncompleteDetails.Reason, short.Usage)
	}

	// Bad input: a 400 naming the field.
	for _, tc := range []struct{ name, body, param string }{
		{"an unknown item type", `{"model":"mock","input":[{"type":"telepathy","role":"user"}]}`, "input[0].type"},
		{"a bad tool schema", `{"model":"mock","input":"x","tools":[{"type":"function","name":"f","parameters":[1]}]}`, "tools[0].parameters"},
		{"a wrong type", `{"model":"mock","input":"x","max_output_tokens":"ten"}`, "max_output_tokens"},
	} {
		wantParam(t, tc.name, api.do(t, http.MethodPost, "/v1/responses", []byte(tc.body), nil), tc.param)
	}

	if err := c.Responses.Delete(ctx, id); err != nil {
		t.Fatalf("delete: %v", err)
	}
	for _, path := range []string{"/v1/responses/" + id, "/v1/responses/" + id + "/input_items", "/v1/responses/" + id + "?stream=true"} {
		api.get(t, path).want(t, "after delete: GET "+path, 404, "response_not_found")
	}
}

// TestResponsesBackgroundSurvivesFrontendAndWorker: a background response
// created on frontend 1 and followed there from sequence 1 is resumed on
// frontend 2 after frontend 1 and the serving worker are both killed: the
// events are contiguous across the resume, the text is the undisturbed one,
// the response completes.
func TestResponsesBackgroundSurvivesFrontendAndWorker(t *testing.T) {
	t.Parallel()
	s, f1, f2 := twoFrontendsWorkers(t, []string{"--mock-hold-at-token", "60"}, "--default-max-tokens", "150") // held there until the kills
	ctx := context.Background()
	question := "a background answer outlives its frontend and its worker"
	created := createBackground(t, f1.url, question)
	if (created.Status != "queued" && created.Status != "in_progress") || !created.Background {
		t.Fatalf("create: status %q, background %v", created.Status, created.Background)
	}
	id := created.ID
	var once sync.Once
	first := readResponseStream(sdk(f1.url, "").Responses.GetStreaming(ctx, id, responses.ResponseGetParams{StartingAfter: openai.Int(1)}),
		func(ev responses.ResponseStreamEventUnion) bool {
			if ev.SequenceNumber >= 30 {
				once.Do(func() {
					w := f1.servingWorker(t, id)
					f1.signal(syscall.SIGKILL)
					s.workers[w].signal(syscall.SIGKILL)
					s.release(w)
				})
			}
			return true
		})
	if len(first.seqs) == 0 || first.last.Type == "response.completed" {
		t.Fatalf("the first stream saw %d events, the last %q: the kill came too late", len(first.seqs), first.last.Type)
	}
	contiguous(t, "frontend 1", first.seqs, 2)
	lastSeen := first.seqs[len(first.seqs)-1]
	rest := readResponseStream(sdk(f2.url, "").Responses.GetStreaming(ctx, id, responses.ResponseGetParams{StartingAfter: openai.Int(lastSeen)}), nil)
	if rest.err != nil {
		t.Fatalf("resume on frontend 2: %v", rest.err)
	}
	contiguous(t, "frontend 2", rest.seqs, lastSeen+1)
	if got, want := first.text+rest.text, engine.MockText("user: "+question, 0, 150); got != want {
		t.Fatalf("joined text differs from an undisturbed run:\n got %q\nwant %q", got, want)
	}
	if rest.last.Type != "response.completed" || rest.last.Response.Status != "completed" {
		t.Fatalf("resumed stream ends with %q, status %q", rest.last.Type, rest.last.Response.Status)
	}
	got := getResponse(t, apiClient{url: f2.url}, id)
	if want := rawJSON(t, rest.last.RawJSON()).(map[string]any)["response"]; !reflect.DeepEqual(any(got), want) {
		t.Errorf("GET on frontend 2 differs from the final event's response")
	}
	if st := f2.state(t, id); len(st.Migrations) != 1 {
		t.Errorf("migrations %+v, want one", st.Migrations)
	}
}

// TestResponsesCancelFromAnotherFrontend: a background response cancelled
// on the other frontend mid-answer answers cancelled everywhere, and its
// stream ends with response.incomplete carrying status cancelled.
func TestResponsesCancelFromAnotherFrontend(t *testing.T) {
	_, f1, f2 := twoFrontends(t, "--default-max-tokens", "1000")
	ctx := context.Background()
	created := createBackground(t, f1.url, "cancel me from elsewhere")
	// Follow it on frontend 2 until it has produced some text.
	readResponseStream(sdk(f2.url, "").Responses.GetStreaming(ctx, created.ID, responses.ResponseGetParams{}),
		func(ev responses.ResponseStreamEventUnion) bool { return ev.SequenceNumber < 10 })
	cancelled, err := sdk(f2.url, "").Responses.Cancel(ctx, created.ID)
	if err != nil || cancelled.Status != "cancelled" {
		t.Fatalf("cancel: %v, %+v", err, cancelled)
	}
	if got := getResponse(t, apiClient{url: f1.url}, created.ID); got["status"] != "cancelled" {
		t.Errorf("GET on frontend 1: status %v", got["status"])
	}
	all := readResponseStream(sdk(f1.url, "").Responses.GetStreaming(ctx, created.ID, responses.ResponseGetParams{}), nil)
	contiguous(t, "replay", all.seqs, 0)
	if all.last.Type != "response.incomplete" || all.last.Response.Status != "cancelled" || all.text == "" {
		t.Errorf("replay ends with %q status %q after text %q", all.last.Type, all.last.Response.Status, all.text)
	}
	if n := len([]rune(all.text)); n >= len(engine.MockText("user: cancel me from elsewhere", 0, 1000)) {
		t.Errorf("the cancelled response has the whole answer")
	}
}

// TestResponsesFunctionCallingAndFormat runs OpenAI-engine workers in front
// of the vLLM simulator: a tool call, answered with a function_call_output
// on the other frontend through previous_response_id, reaches the engine as
// the whole conversation; text.format json_schema reaches it as
// response_format.
func TestResponsesFunctionCallingAndFormat(t *testing.T) {
	sim := startSim(t, "sim", "--greedy")
	s := newStack(t)
	f1, f2 := s.frontend(nil), s.frontend(nil)
	s.openaiWorker("o1", sim)
	f1.waitRoutable(t, "o1")
	f2.waitRoutable(t, "o1")
	ctx := context.Background()
	weather := responses.ToolParamOfFunction("get_weather", map[string]any{
		"type": "object", "properties": map[string]any{"input": map[string]any{"type": "string"}},
	}, false)
	call, err := sdk(f1.url, "").Responses.New(ctx, responses.ResponseNewParams{
		Model: "sim", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("what is the weather in Paris")},
		Instructions: openai.String("use the tools"), Tools: []responses.ToolUnionParam{weather},
	})
	if err != nil || call.Status != "completed" || len(call.Output) != 1 || call.Output[0].Type != "function_call" {
		t.Fatalf("tool call: %v %+v", err, call)
	}
	fc := call.Output[0].AsFunctionCall()
	if fc.Name != "get_weather" || fc.CallID == "" || !json.Valid([]byte(fc.Arguments)) {
		t.Fatalf("function call %+v", fc)
	}
	// Streamed, the call's arguments arrive as deltas that add up to it.
	streamed := readResponseStream(sdk(f2.url, "").Responses.NewStreaming(ctx, responses.ResponseNewParams{
		Model: "sim", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("what is the weather in Paris")},
		Instructions: openai.String("use the tools"), Tools: []responses.ToolUnionParam{weather},
	}), func(ev responses.ResponseStreamEventUnion) bool { return true })
	contiguous(t, "streamed tool call", streamed.seqs, 0)
	var args, done string
	for _, raw := range streamed.raw {
		var ev struct{ Type, Delta, Arguments string }
		_ = json.Unmarshal([]byte(raw), &ev)
		switch ev.Type {
		case "response.function_call_arguments.delta":
			args += ev.Delta
		case "response.function_call_arguments.done":
			done = ev.Arguments
		}
	}
	if args == "" || args != done || args != fc.Arguments || streamed.last.Type != "response.completed" {
		t.Errorf("streamed tool call: deltas %q, done %q, unary %q, last %q", args, done, fc.Arguments, streamed.last.Type)
	}
	out := responses.ResponseInputItemParamOfFunctionCallOutput("sunny and 21 degrees")
	out.OfFunctionCallOutput.CallID = openai.String(fc.CallID)
	answer, err := sdk(f2.url, "").Responses.New(ctx, responses.ResponseNewParams{
		Model: "sim", PreviousResponseID: openai.String(call.ID),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{out}},
	})
	if err != nil || answer.Status != "completed" || answer.OutputText() == "" || answer.PreviousResponseID != call.ID {
		t.Fatalf("follow-up: %v %+v", err, answer)
	}
	gens := sim.generations(t)
	var msgs []struct {
		Role       string `json:"role"`
		Content    string `json:"content"`
		ToolCallID string `json:"tool_call_id"`
		ToolCalls  []struct {
			ID string `json:"id"`
		} `json:"tool_calls"`
	}
	data, _ := json.Marshal(gens[len(gens)-1].Body["messages"])
	_ = json.Unmarshal(data, &msgs)
	if len(msgs) != 3 || msgs[0].Role != "user" || msgs[0].Content != "what is the weather in Paris" ||
		msgs[1].Role != "assistant" || len(msgs[1].ToolCalls) != 1 || msgs[1].ToolCalls[0].ID != fc.CallID ||
		msgs[2].Role != "tool" || msgs[2].ToolCallID != fc.CallID || msgs[2].Content != "sunny and 21 degrees" {
		t.Errorf("the follow-up reached the engine as %s, want user, assistant tool call %s, tool output (no instructions)", data, fc.CallID)
	}

	schema := map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}
	_, err = sdk(f1.url, "").Responses.New(ctx, responses.ResponseNewParams{
		Model: "sim", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("a city as JSON")},
		Text: responses.ResponseTextConfigParam{Format: responses.ResponseFormatTextConfigUnionParam{
			OfJSONSchema: &responses.ResponseFormatTextJSONSchemaConfigParam{Name: "city", Schema: schema}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	gens = sim.generations(t)
	rf, _ := json.Marshal(gens[len(gens)-1].Body["response_format"])
	if want := `{"json_schema":{"name":"city","schema":{"properties":{"city":{"type":"string"}},"type":"object"}},"type":"json_schema"}`; string(rf) != want {
		t.Errorf("response_format at the engine:\n got %s\nwant %s", rf, want)
	}
}

// TestResponsesTenancy: another tenant's response is 404 on every route,
// previous_response_id included; its owner and the admin see it.
func TestResponsesTenancy(t *testing.T) {
	_, f, _ := keyedStack(t)
	ctx := context.Background()
	r, err := sdk(f.url, aliceKey).Responses.New(ctx, responses.ResponseNewParams{
		Model: "mock", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("mine alone")},
		MaxOutputTokens: openai.Int(5),
	})
	if err != nil {
		t.Fatal(err)
	}
	bob := apiClient{url: f.url, key: bobKey}
	for _, rt := range []struct{ method, path string }{
		{http.MethodGet, "/v1/responses/" + r.ID}, {http.MethodGet, "/v1/responses/" + r.ID + "?stream=true"},
		{http.MethodGet, "/v1/responses/" + r.ID + "/input_items"}, {http.MethodPost, "/v1/responses/" + r.ID + "/cancel"},
		{http.MethodDelete, "/v1/responses/" + r.ID},
	} {
		bob.do(t, rt.method, rt.path, nil, nil).want(t, "bob: "+rt.method+" "+rt.path, 404, "response_not_found")
	}
	chain := `{"model":"mock","input":"and then?","previous_response_id":"` + r.ID + `"}`
	bob.do(t, http.MethodPost, "/v1/responses", []byte(chain), nil).want(t, "bob chains alice's", 404, "previous_response_not_found")
	if got := getResponse(t, apiClient{url: f.url, key: aliceKey}, r.ID); got["status"] != "incomplete" {
		t.Errorf("alice's GET: status %v", got["status"])
	}
	getResponse(t, apiClient{url: f.url, key: adminKey}, "alice:"+r.ID)
}

// TestResponsesCompactionKeepsRenderings: a finished response (one
// migrated mid-answer) reads the same, byte for byte, before and after its
// deltas are folded into its compact record: the object, the whole event
// stream and a resume from the middle.
func TestResponsesCompactionKeepsRenderings(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	f := s.frontend(nil, "--log-compaction=false", "--migration-limit", "3", "--nats-system-url", s.sysURL())
	s.worker("w1", "--mock-tokens-per-sec", "300", "--mock-ttft", "5ms")
	s.worker("w2", "--mock-tokens-per-sec", "300", "--mock-ttft", "5ms")
	f.waitRoutable(t, "w1", "w2")
	ctx := context.Background()
	c := sdk(f.url, "")
	var once sync.Once
	res := readResponseStream(c.Responses.NewStreaming(ctx, responses.ResponseNewParams{
		Model: "mock", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("compact me after a migration")},
		MaxOutputTokens: openai.Int(60),
	}), func(ev responses.ResponseStreamEventUnion) bool {
		if ev.SequenceNumber == 20 {
			once.Do(func() {
				id := ev.ItemID[len("msg_") : len(ev.ItemID)-len("_0")]
				s.workers[f.servingWorker(t, id)].signal(syscall.SIGKILL)
			})
		}
		return true
	})
	if res.err != nil || res.last.Type != "response.incomplete" {
		t.Fatalf("stream: %v, last %q", res.err, res.last.Type)
	}
	id := res.last.Response.ID
	if st := f.state(t, id); len(st.Migrations) != 1 {
		t.Fatalf("migrations %+v, want one", st.Migrations)
	}
	// The migrated stream carried on with the next sequence number and the
	// undisturbed text.
	contiguous(t, "migrated stream", res.seqs, 0)
	if want := engine.MockText("user: compact me after a migration", 0, 60); res.text != want {
		t.Fatalf("migrated text differs from an undisturbed run:\n got %q\nwant %q", res.text, want)
	}
	api := apiClient{url: f.url}
	read := func() []string {
		return []string{
			string(api.get(t, "/v1/responses/"+id).body),
			string(api.get(t, "/v1/responses/"+id+"?stream=true").body),
			string(api.get(t, "/v1/responses/"+id+"?stream=true&starting_after=30").body),
		}
	}
	before := read()
	if !strings.Contains(before[1], "event: response.incomplete") {
		t.Fatalf("the stream before compaction: %s", before[1])
	}
	if out, errOut, code := runTool(t, batonBin, "compact", "--nats", s.natsURL, id); code != 0 {
		t.Fatalf("baton compact: exit %d\n%s%s", code, out, errOut)
	}
	f2 := s.frontend(nil) // has never followed it: reads the compact record alone
	api = apiClient{url: f2.url}
	for i, after := range read() {
		if after != before[i] {
			t.Errorf("rendering %d changed by compaction:\n got %s\nwant %s", i, after, before[i])
		}
	}
}

// TestResponsesChainBounded: previous_response_id chains carry each
// response's input and output forward until the conversation exceeds
// --max-prompt-tokens, which is a 400 naming previous_response_id.
func TestResponsesChainBounded(t *testing.T) {
	_, fe := startBasic(t, "--max-prompt-tokens", "30")
	ctx := context.Background()
	c := sdk(fe.url, "")
	first, err := c.Responses.New(ctx, responses.ResponseNewParams{
		Model: "mock", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("one two three")},
		MaxOutputTokens: openai.Int(10),
	})
	if err != nil {
		t.Fatal(err)
	}
	// "user: one two three", "assistant: " and 10 words, "user: again": 17 words.
	second, err := c.Responses.New(ctx, responses.ResponseNewParams{
		Model: "mock", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("again")},
		PreviousResponseID: openai.String(first.ID), MaxOutputTokens: openai.Int(10),
	})
	if err != nil || second.Usage.InputTokens != 17 {
		t.Fatalf("second: %v, input tokens %d, want 17 (the first's input and output, then its own)", err, second.Usage.InputTokens)
	}
	if want := engine.MockText("user: one two three\nassistant: "+first.OutputText()+"\nuser: again", 0, 10); second.OutputText() != want {
		t.Errorf("second's text %q, want the mock's answer to the whole conversation %q", second.OutputText(), want)
	}
	// 17 + 11 + 2 = 30 words, exactly the limit; then 30 + 11 + 2 = 43.
	third, err := c.Responses.New(ctx, responses.ResponseNewParams{
		Model: "mock", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("again")},
		PreviousResponseID: openai.String(second.ID), MaxOutputTokens: openai.Int(10),
	})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"mock","input":"again","previous_response_id":"` + third.ID + `"}`
	wantParam(t, "a chain past --max-prompt-tokens", apiClient{url: fe.url}.do(t, http.MethodPost, "/v1/responses", []byte(body), nil), "previous_response_id")
}

// TestResponsesIdempotentRetry: a client's own X-Request-Id names the
// response; a retry with the same body answers with that response, another
// body (or another endpoint) is a 409.
func TestResponsesIdempotentRetry(t *testing.T) {
	_, fe := startBasic(t)
	api := apiClient{url: fe.url}
	hdr := map[string]string{"X-Request-Id": "my-response-1"}
	body := []byte(`{"model":"mock","input":"once only","max_output_tokens":8}`)
	first := api.do(t, http.MethodPost, "/v1/responses", body, hdr)
	first.want(t, "create", 200, "")
	again := api.do(t, http.MethodPost, "/v1/responses", body, hdr)
	again.want(t, "retry", 200, "")
	if string(again.body) != string(first.body) || !strings.Contains(string(first.body), `"id":"my-response-1"`) {
		t.Errorf("the retry answered\n%s\nthe first\n%s", again.body, first.body)
	}
	api.do(t, http.MethodPost, "/v1/responses", []byte(`{"model":"mock","input":"another"}`), hdr).want(t, "another body", 409, "request_id_conflict")
	api.do(t, http.MethodPost, "/v1/chat/completions", []byte(`{"model":"mock","messages":[{"role":"user","content":"x"}]}`), hdr).
		want(t, "another endpoint", 409, "request_id_conflict")
	chat := api.do(t, http.MethodPost, "/v1/chat/completions", []byte(`{"model":"mock","messages":[{"role":"user","content":"x"}]}`),
		map[string]string{"X-Request-Id": "a-chat-1"})
	chat.want(t, "a chat completion", 200, "")
	api.get(t, "/v1/responses/a-chat-1").want(t, "a chat request as a response", 404, "response_not_found")
	if st := fe.state(t, "my-response-1"); st.Status != "completed" {
		t.Errorf("GET /v1/requests: status %q", st.Status)
	}
}
