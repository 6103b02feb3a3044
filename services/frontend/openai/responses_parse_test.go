package openai

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/baton-dev/baton/events"
)

func TestParseResponseRequestErrors(t *testing.T) {
	cases := []struct{ name, body, param string }{
		{"no model", `{"input":"x"}`, "model"},
		{"model of the wrong type", `{"model":3,"input":"x"}`, "model"},
		{"no input", `{"model":"m"}`, "input"},
		{"input of the wrong type", `{"model":"m","input":3}`, "input"},
		{"an unknown item type", `{"model":"m","input":[{"type":"image_generation_call"}]}`, "input[0].type"},
		{"a bad role", `{"model":"m","input":[{"role":"robot","content":"x"}]}`, "input[0].role"},
		{"a content part of another type", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image"}]}]}`, "input[0].content[0].type"},
		{"a function call without call_id", `{"model":"m","input":[{"type":"function_call","name":"f"}]}`, "input[0].call_id"},
		{"a tool of another type", `{"model":"m","input":"x","tools":[{"type":"web_search"}]}`, "tools[0].type"},
		{"a tool schema that is not an object", `{"model":"m","input":"x","tools":[{"type":"function","name":"f","parameters":"nope"}]}`, "tools[0].parameters"},
		{"a tool without a name", `{"model":"m","input":"x","tools":[{"type":"function"}]}`, "tools[0].name"},
		{"max_output_tokens too large", `{"model":"m","input":"x","max_output_tokens":100000}`, "max_output_tokens"},
		{"max_output_tokens a string", `{"model":"m","input":"x","max_output_tokens":"5"}`, "max_output_tokens"},
		{"temperature out of range", `{"model":"m","input":"x","temperature":3}`, "temperature"},
		{"stream of the wrong type", `{"model":"m","input":"x","stream":"yes"}`, "stream"},
		{"an unknown format", `{"model":"m","input":"x","text":{"format":{"type":"yaml"}}}`, "text.format.type"},
		{"json_schema without a schema", `{"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"s"}}}`, "text.format.schema"},
		{"background without store", `{"model":"m","input":"x","background":true,"store":false}`, "background"},
		{"a bad tool_choice", `{"model":"m","input":"x","tool_choice":"always"}`, "tool_choice"},
	}
	for _, tc := range cases {
		_, err := ParseResponseRequest([]byte(tc.body), 1000)
		if err == nil || err.Param != tc.param || err.Status != 400 {
			t.Errorf("%s: got %+v, want a 400 with param %q", tc.name, err, tc.param)
		}
	}
}

func TestResponseRequestToChat(t *testing.T) {
	body := `{"model":"m","instructions":"be brief","input":[
		{"role":"user","content":[{"type":"input_text","text":"weather?"}]},
		{"type":"function_call","call_id":"c1","name":"get","arguments":"{}"},
		{"type":"function_call_output","call_id":"c1","output":"sunny"}],
		"tools":[{"type":"function","name":"get","parameters":{"type":"object"}}],
		"tool_choice":{"type":"function","name":"get"},
		"text":{"format":{"type":"json_schema","name":"w","schema":{"type":"object"},"strict":true}}}`
	q, err := ParseResponseRequest([]byte(body), 1000)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for k, v := range q.chat {
		got[k] = string(v)
	}
	want := map[string]string{
		"tools":           `[{"function":{"name":"get","parameters":{"type":"object"}},"type":"function"}]`,
		"tool_choice":     `{"function":{"name":"get"},"type":"function"}`,
		"response_format": `{"json_schema":{"name":"w","schema":{"type":"object"},"strict":true},"type":"json_schema"}`,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %s, want %s", k, got[k], v)
		}
	}
	msgs, _ := json.Marshal(chatMessages(q.Input))
	if w := `[{"content":"weather?","role":"user"},{"content":null,"role":"assistant","tool_calls":[{"function":{"arguments":"{}","name":"get"},"id":"c1","type":"function"}]},{"content":"sunny","role":"tool","tool_call_id":"c1"}]`; string(msgs) != w {
		t.Errorf("messages:\n got %s\nwant %s", msgs, w)
	}
	var back []chatMessage
	_ = json.Unmarshal(msgs, &back)
	if got := itemsOfMessages(back); len(got) != 3 || got[1].CallID != "c1" || got[2].Output != "sunny" {
		t.Errorf("itemsOfMessages: %+v", got)
	}
	if p, want := PromptText(q.Input), "user: weather?\nassistant: get({})\ntool: sunny"; p != want {
		t.Errorf("prompt %q, want %q", p, want)
	}
}

func TestParamErrorBody(t *testing.T) {
	cases := []struct {
		name string
		err  *ParamError
		want string
	}{
		{name: "a field at fault", err: BadParam("input[0].role", "invalid_value", "'%s' is bad", "input[0].role"),
			want: `{"code":"invalid_value","message":"'input[0].role' is bad","param":"input[0].role","type":"invalid_request_error"}`},
		{name: "the body as a whole: param null", err: BadParam("", "invalid_json", "not JSON"),
			want: `{"code":"invalid_json","message":"not JSON","param":null,"type":"invalid_request_error"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := jsonOf(t, tc.err.Body()); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
			if tc.err.Status != 400 || tc.err.Error() != tc.err.Message {
				t.Errorf("got status %d, error %q; want 400, the message", tc.err.Status, tc.err.Error())
			}
		})
	}
}

func TestInputItemList(t *testing.T) {
	acc := events.RequestAccepted{Body: json.RawMessage(`{"model":"m","input":[
		{"role":"user","content":"a"},
		{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
		{"type":"function_call_output","call_id":"c1","output":"b"}]}`)}
	ids := func(list map[string]any) string {
		var out []string
		for _, d := range list["data"].([]map[string]any) {
			out = append(out, d["id"].(string))
		}
		return strings.Join(out, " ")
	}
	cases := []struct {
		name, order, after string
		limit              int
		want               string
		more               bool
	}{
		{name: "desc", order: "desc", limit: 20, want: "item_r_2 item_r_1 item_r_0"},
		{name: "asc", order: "asc", limit: 20, want: "item_r_0 item_r_1 item_r_2"},
		{name: "after an item", order: "asc", after: "item_r_0", limit: 20, want: "item_r_1 item_r_2"},
		{name: "a page", order: "asc", limit: 2, want: "item_r_0 item_r_1", more: true},
		{name: "after an unknown item: from the start", order: "desc", after: "item_x", limit: 1, want: "item_r_2", more: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			list := InputItemList("r", acc, tc.order, tc.after, tc.limit)
			if got := ids(list); got != tc.want || list["has_more"] != tc.more {
				t.Errorf("got %q (has_more %v), want %q (%v)", got, list["has_more"], tc.want, tc.more)
			}
		})
	}
	first := InputItemList("r", acc, "asc", "", 20)["data"].([]map[string]any)
	if got := jsonOf(t, first[0]); got != `{"content":[{"text":"a","type":"input_text"}],"id":"item_r_0","role":"user","status":"completed","type":"message"}` {
		t.Errorf("a message item: %s", got)
	}
	if got := jsonOf(t, first[1]); got != `{"arguments":"{}","call_id":"c1","id":"item_r_1","name":"f","status":"completed","type":"function_call"}` {
		t.Errorf("a function call item: %s", got)
	}
}
