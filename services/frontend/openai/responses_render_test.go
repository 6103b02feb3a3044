package openai

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

// foldResponse folds a response of the given tokens (deltas of the sizes
// given, one attempt) and its end.
func foldResponse(t testing.TB, body string, tokens []string, details []json.RawMessage, sizes []int, finish string) (*projections.Request, []events.Envelope) {
	t.Helper()
	var envs []events.Envelope
	add := func(ev events.Event) { envs = append(envs, events.Envelope{Seq: uint64(len(envs) + 1), Event: ev}) }
	add(events.RequestAccepted{RequestID: "r1", Model: "m", Endpoint: events.EndpointResponses, Body: json.RawMessage(body), MaxTokens: max(64, len(tokens)), Created: 7})
	add(events.RequestRouted{RequestID: "r1", WorkerID: "w1"})
	off := 0
	for _, n := range sizes {
		d := events.TokensGenerated{RequestID: "r1", Offset: off, Tokens: tokens[off : off+n]}
		if details != nil {
			d.Details = details[off : off+n]
		}
		add(d)
		off += n
	}
	if finish != "" {
		add(events.RequestCompleted{RequestID: "r1", FinishReason: finish})
	}
	p := projections.NewRequest()
	for _, e := range envs {
		p.Apply(e)
	}
	return p, envs
}

// emitted is an event as it was emitted: its JSON is taken at once.
type emitted struct {
	seq  int
	typ  string
	json string
}

func (r emitted) data() string { return r.json }

func allEvents(p *projections.Request) []emitted {
	var out []emitted
	renderResponse("resp_1", p, func(e ResponseEvent) { out = append(out, emitted{e.seq, e.typ, string(e.data())}) })
	return out
}

func TestResponseEventsArePrefixStable(t *testing.T) {
	tokens := []string{"a ", "b ", "c ", "d ", "e "}
	full, envs := foldResponse(t, `{"model":"m","input":"hi"}`, tokens, nil, []int{2, 1, 2}, "stop")
	want := allEvents(full)
	if got := len(want); got != 4+len(tokens)+3+1 {
		t.Fatalf("got %d events, want %d (2 + 2 item openers + 5 deltas + 3 closers + 1 terminal)", got, 4+len(tokens)+4)
	}
	for i, e := range want {
		if e.seq != i {
			t.Fatalf("event %d has sequence_number %d", i, e.seq)
		}
	}
	if want[4].typ != "response.output_text.delta" || want[len(want)-1].typ != "response.completed" {
		t.Errorf("event 4 is %s, last %s", want[4].typ, want[len(want)-1].typ)
	}
	// Every earlier state renders a prefix, whatever the delta boundaries.
	for k := 1; k < len(envs); k++ {
		p := projections.NewRequest()
		for _, e := range envs[:k] {
			p.Apply(e)
		}
		got := allEvents(p)
		for i, e := range got {
			if e.data() != want[i].data() {
				t.Fatalf("after %d events, event %d differs:\n got %s\nwant %s", k, i, e.data(), want[i].data())
			}
		}
	}
	// Other delta boundaries, and the compact record, render the same bytes.
	other, _ := foldResponse(t, `{"model":"m","input":"hi"}`, tokens, nil, []int{1, 1, 1, 1, 1}, "stop")
	rec, err := full.Compact()
	if err != nil {
		t.Fatal(err)
	}
	compacted := projections.NewRequest()
	compacted.Apply(envs[0])
	compacted.Apply(events.Envelope{Seq: 99, Event: rec})
	for name, p := range map[string]*projections.Request{"one token a delta": other, "compacted": compacted} {
		got := allEvents(p)
		if len(got) != len(want) {
			t.Fatalf("%s: %d events, want %d", name, len(got), len(want))
		}
		for i := range got {
			if got[i].data() != want[i].data() {
				t.Fatalf("%s: event %d differs:\n got %s\nwant %s", name, i, got[i].data(), want[i].data())
			}
		}
	}
}

func TestResponseToolCallEvents(t *testing.T) {
	tokens := []string{"ok", "", "", ""}
	details := []json.RawMessage{nil,
		json.RawMessage(`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get","arguments":"{\"a\""}}]}`),
		json.RawMessage(`{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}`),
		json.RawMessage(`{"tool_calls":[{"index":1,"id":"call_2","type":"function","function":{"name":"put","arguments":"{}"}}]}`)}
	p, _ := foldResponse(t, `{"model":"m","input":"hi","max_output_tokens":4}`, tokens, details, []int{4}, "tool_calls")
	var types []string
	for _, e := range allEvents(p) {
		types = append(types, strings.TrimPrefix(e.typ, "response."))
	}
	want := "created in_progress output_item.added content_part.added output_text.delta " +
		"output_text.done content_part.done output_item.done " +
		"output_item.added function_call_arguments.delta function_call_arguments.delta " +
		"function_call_arguments.done output_item.done " +
		"output_item.added function_call_arguments.delta function_call_arguments.done output_item.done completed"
	if got := strings.Join(types, " "); got != want {
		t.Fatalf("events:\n got %s\nwant %s", got, want)
	}
	obj, _ := renderResponse("resp_1", p, nil)
	out := obj["output"].([]map[string]any)
	if len(out) != 3 || out[1]["arguments"] != `{"a":1}` || out[1]["call_id"] != "call_1" || out[2]["name"] != "put" {
		t.Errorf("output %+v", out)
	}
}

func TestResponseStatus(t *testing.T) {
	cases := []struct {
		name, body, finish, want string
		incomplete               bool
	}{
		{name: "stop", body: `{"model":"m","input":"x"}`, finish: "stop", want: "completed"},
		{name: "max_output_tokens hit", body: `{"model":"m","input":"x","max_output_tokens":2}`, finish: "length", want: "incomplete", incomplete: true},
		{name: "baton's default budget hit", body: `{"model":"m","input":"x"}`, finish: "length", want: "completed"},
		{name: "stopped by a cancel", body: `{"model":"m","input":"x"}`, finish: "cancelled", want: "cancelled"},
		{name: "running", body: `{"model":"m","input":"x"}`, want: "in_progress"},
	}
	for _, tc := range cases {
		p, _ := foldResponse(t, tc.body, []string{"a", "b"}, nil, []int{2}, tc.finish)
		obj, _ := renderResponse("resp_1", p, nil)
		if obj["status"] != tc.want || (obj["incomplete_details"] != nil) != tc.incomplete {
			t.Errorf("%s: status %v, incomplete_details %v; want %s", tc.name, obj["status"], obj["incomplete_details"], tc.want)
		}
	}
}

// TestTextDeltaBytes holds the text delta's hand-written JSON to what
// encoding/json writes for the same event.
func TestTextDeltaBytes(t *testing.T) {
	for _, text := range []string{"", "plain ", "<b>&\"quoted\"\n", "\u2028 \u00e9 \U0001F600", "\xff\xfe bad", "tab\t\x01"} {
		d := &textDelta{itemID: "msg_resp_1_0", index: 3, delta: text}
		fast := ResponseEvent{seq: 42, typ: "response.output_text.delta", text: d}
		slow := ResponseEvent{seq: 42, typ: "response.output_text.delta", body: func() map[string]any {
			return map[string]any{"item_id": d.itemID, "output_index": d.index, "content_index": 0, "delta": d.delta, "logprobs": []any{}}
		}}
		if got, want := string(fast.data()), string(slow.data()); got != want {
			t.Errorf("%q:\n got %s\nwant %s", text, got, want)
		}
	}
}

// TestPreviousTurns: a finished response's conversation, for a later
// response's previous_response_id, is its input as the engine got it less
// its instructions, then its output (text, and function calls as such).
func TestPreviousTurns(t *testing.T) {
	body := `{"model":"m","instructions":"be brief","input":"weather?"}`
	q, perr := ParseResponseRequest([]byte(body), 100)
	if perr != nil {
		t.Fatal(perr)
	}
	items := append([]InputItem{{Type: "message", Role: "system", Text: q.Instructions}}, q.Input...)
	call := json.RawMessage(`{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"get","arguments":"{}"}}]}`)
	p, _ := foldResponse(t, body, []string{"let me see", ""}, []json.RawMessage{nil, call}, []int{2}, "tool_calls")
	p.Accepted.EngineBody = q.EngineBody(items, 64)
	got, _ := json.Marshal(PreviousTurns("resp_1", p))
	if want := `[{"type":"message","role":"user"},{"type":"message","role":"assistant"},{"type":"function_call","call_id":"c1","name":"get","arguments":"{}"}]`; string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if turns := PreviousTurns("resp_1", p); turns[0].Text != "weather?" || turns[1].Text != "let me see" {
		t.Errorf("got texts %q, %q; want the input and the output", turns[0].Text, turns[1].Text)
	}
}
