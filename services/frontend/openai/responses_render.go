package openai

import (
	"encoding/json"
	"strconv"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

// A response (a request of events.EndpointResponses) rendered from its
// projection: the response object and its stream of semantic events, each
// with its sequence_number. Shapes follow OpenAI's API reference:
//   - https://platform.openai.com/docs/api-reference/responses/object
//     (id, object, created_at, status, output items of type message with
//     output_text parts and function_call, usage, incomplete_details, error);
//   - https://platform.openai.com/docs/api-reference/responses-streaming
//     (response.created, response.in_progress, response.output_item.added,
//     response.content_part.added, response.output_text.delta and .done,
//     response.content_part.done, response.output_item.done,
//     response.function_call_arguments.delta and .done, response.completed,
//     response.incomplete, response.failed; every event's sequence_number);
//   - https://platform.openai.com/docs/guides/background (background: true,
//     GET /v1/responses/{id}?stream=true&starting_after=N, cancel).
//
// The sequence numbers are a pure function of the request's folded state,
// as SSE ids (token offsets) are: the events are generated from the tokens
// in order, the events of token i depending only on tokens 0..i and their
// details, and the closing events only on the terminal state. So the events
// of a request so far are a prefix of its events at any later time, on any
// frontend, before and after compaction and migrations (the fold gives
// every reader the same tokens), and a resume after sequence number N
// writes the events from N+1 on with no gap and no repeat. The rule:
//
//	0: response.created, 1: response.in_progress;
//	per token, in order: when it starts an output item (text after none or
//	after a function call; a tool call of another index), the closing
//	events of the open item, then output_item.added (and, for a message,
//	content_part.added); then one output_text.delta for its text and one
//	function_call_arguments.delta per tool-call delta with arguments;
//	at the end: the open item's closing events (output_text.done,
//	content_part.done, output_item.done; or function_call_arguments.done,
//	output_item.done), then one terminal event.
//
// For an answer of text alone, token i is event 4+i and the terminal event
// of n tokens is 4+n+3.

// ResponseEvent is one event of a response's stream, as a ResponseRender
// emits it (ResponseSSE writes it). Its JSON is built only when asked for,
// and only during the call that emits it: the body reads the renderer's
// state, which moves on after the call.
type ResponseEvent struct {
	seq  int
	typ  string
	body func() map[string]any // without type and sequence_number
	text *textDelta            // set for response.output_text.delta: the hot path
}

// textDelta is the body of a response.output_text.delta event.
type textDelta struct {
	itemID string
	index  int
	delta  string
}

// data is the event's JSON.
func (e ResponseEvent) data() []byte { return e.appendData(nil) }

// appendData appends the event's JSON to b: as encoding/json writes the
// map of its body (keys sorted, HTML escaped), a text delta without it.
func (e ResponseEvent) appendData(b []byte) []byte {
	if d := e.text; d != nil {
		b = append(b, `{"content_index":0,"delta":`...)
		b = appendJSONString(b, []byte(d.delta))
		b = append(b, `,"item_id":`...)
		b = appendJSONString(b, []byte(d.itemID))
		b = append(b, `,"logprobs":[],"output_index":`...)
		b = strconv.AppendInt(b, int64(d.index), 10)
		b = append(b, `,"sequence_number":`...)
		b = strconv.AppendInt(b, int64(e.seq), 10)
		return append(b, `,"type":"response.output_text.delta"}`...)
	}
	m := e.body()
	m["type"] = e.typ
	m["sequence_number"] = e.seq
	j, _ := json.Marshal(m)
	return append(b, j...)
}

// outItem is one output item being rendered.
type outItem struct {
	kind      string // "message" or "function_call"
	id        string
	index     int // output_index
	text      []byte
	callID    string
	name      string
	toolIndex int
	status    string
}

func (it *outItem) json() map[string]any {
	if it.kind == "function_call" {
		return map[string]any{"id": it.id, "type": "function_call", "status": it.status,
			"call_id": it.callID, "name": it.name, "arguments": string(it.text)}
	}
	content := []map[string]any{}
	if it.status != "in_progress" || len(it.text) > 0 {
		content = append(content, textPart(string(it.text)))
	}
	return map[string]any{"id": it.id, "type": "message", "status": it.status, "role": "assistant", "content": content}
}

func textPart(text string) map[string]any {
	return map[string]any{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": []any{}}
}

// ResponseRender renders one response's events and object as its tokens
// are fed to it, in order (see the rule above). A ResponseRender is used by
// one goroutine.
type ResponseRender struct {
	public string // the response id the client knows
	acc    events.RequestAccepted
	fields map[string]json.RawMessage // the client's body
	max    int                        // max_output_tokens, 0 if unset
	emit   func(ResponseEvent)
	seq    int
	items  []*outItem
	open   *outItem
	n      int // tokens fed
}

// NewResponseRender starts rendering the response of acc, known to its
// reader as public, and emits its first two events; emit receives every
// event (nil: none are kept).
func NewResponseRender(public string, acc events.RequestAccepted, emit func(ResponseEvent)) *ResponseRender {
	b := &ResponseRender{public: public, acc: acc, emit: emit}
	_ = json.Unmarshal(acc.Body, &b.fields)
	_ = json.Unmarshal(b.fields["max_output_tokens"], &b.max)
	b.event("response.created", func() map[string]any { return map[string]any{"response": b.object(b.initialStatus(), nil)} })
	b.event("response.in_progress", func() map[string]any { return map[string]any{"response": b.object("in_progress", nil)} })
	return b
}

func (b *ResponseRender) initialStatus() string {
	if b.acc.Background {
		return "queued"
	}
	return "in_progress"
}

// event emits the next event, of type typ, whose body is built by body
// if the emitter asks for it.
func (b *ResponseRender) event(typ string, body func() map[string]any) {
	if b.emit != nil {
		b.emit(ResponseEvent{seq: b.seq, typ: typ, body: body})
	}
	b.seq++
}

// Feed renders the next tokens and their details (nil, or one per token).
func (b *ResponseRender) Feed(tokens []string, details []json.RawMessage) {
	for i, t := range tokens {
		b.n++
		if t != "" {
			b.text(t)
		}
		if i < len(details) && details[i] != nil {
			var d tokenDetails
			if json.Unmarshal(details[i], &d) == nil {
				for _, c := range d.ToolCalls {
					b.call(c)
				}
			}
		}
	}
}

func (b *ResponseRender) start(kind string) *outItem {
	b.closeOpen("completed")
	it := &outItem{kind: kind, index: len(b.items), status: "in_progress"}
	prefix := "msg_"
	if kind == "function_call" {
		prefix = "fc_"
	}
	it.id = prefix + b.public + "_" + strconv.Itoa(it.index)
	b.items = append(b.items, it)
	b.open = it
	return it
}

func (b *ResponseRender) text(t string) {
	it := b.open
	if it == nil || it.kind != "message" {
		it = b.start("message")
		b.event("response.output_item.added", func() map[string]any {
			return map[string]any{"output_index": it.index, "item": it.json()}
		})
		b.event("response.content_part.added", func() map[string]any {
			return map[string]any{"item_id": it.id, "output_index": it.index, "content_index": 0, "part": textPart("")}
		})
	}
	it.text = append(it.text, t...)
	if b.emit != nil {
		b.emit(ResponseEvent{seq: b.seq, typ: "response.output_text.delta", text: &textDelta{itemID: it.id, index: it.index, delta: t}})
	}
	b.seq++
}

func (b *ResponseRender) call(c toolCallDelta) {
	it := b.open
	if it == nil || it.kind != "function_call" || it.toolIndex != c.Index {
		it = b.start("function_call")
		it.toolIndex, it.callID, it.name = c.Index, c.ID, c.Function.Name
		b.event("response.output_item.added", func() map[string]any {
			return map[string]any{"output_index": it.index, "item": it.json()}
		})
	}
	if it.callID == "" {
		it.callID = c.ID
	}
	if it.name == "" {
		it.name = c.Function.Name
	}
	if a := c.Function.Arguments; a != "" {
		it.text = append(it.text, a...)
		b.event("response.function_call_arguments.delta", func() map[string]any {
			return map[string]any{"item_id": it.id, "output_index": it.index, "delta": a}
		})
	}
}

// closeOpen writes the closing events of the open item, with status.
func (b *ResponseRender) closeOpen(status string) {
	it := b.open
	if it == nil {
		return
	}
	b.open = nil
	it.status = status
	if it.kind == "message" {
		b.event("response.output_text.done", func() map[string]any {
			return map[string]any{"item_id": it.id, "output_index": it.index, "content_index": 0,
				"text": string(it.text), "logprobs": []any{}}
		})
		b.event("response.content_part.done", func() map[string]any {
			return map[string]any{"item_id": it.id, "output_index": it.index, "content_index": 0, "part": textPart(string(it.text))}
		})
	} else {
		b.event("response.function_call_arguments.done", func() map[string]any {
			return map[string]any{"item_id": it.id, "output_index": it.index, "arguments": string(it.text), "name": it.name}
		})
	}
	b.event("response.output_item.done", func() map[string]any {
		return map[string]any{"output_index": it.index, "item": it.json()}
	})
}

// ResponseOutcome is a response's status as its projection says, and how
// it ended once it did (Terminal).
type ResponseOutcome struct {
	Status     string // the response's status: queued, in_progress, completed, incomplete, cancelled, failed
	Terminal   bool   // the response ended: Finish writes its closing events
	incomplete map[string]any
	err        map[string]any
	usage      map[string]any
	completed  int64
	model      string // the model the answer names (projections.Request.ResponseModel)
	exact      *bool  // whether its continuations were exact; nil: none ran (ExactOf)
}

// Outcome is p's status as a response (b reads its max_output_tokens).
// It reads p only, so a caller can take it under p's lock and Finish
// after.
func (b *ResponseRender) Outcome(p *projections.Request) ResponseOutcome {
	o := ResponseOutcome{model: p.ResponseModel(), exact: ExactOf(p)}
	switch p.Status {
	case projections.StatusPending:
		o.Status = "queued"
	case projections.StatusRunning:
		o.Status = "in_progress"
	case projections.StatusCompleted:
		o.Status, o.Terminal = "completed", true
		switch {
		case p.FinishReason == "cancelled":
			o.Status = "cancelled"
		case p.FinishReason == "length" && b.max > 0:
			// The client's max_output_tokens ended it; baton's own default
			// budget (--default-max-tokens) ending it counts as completed.
			o.Status, o.incomplete = "incomplete", map[string]any{"reason": "max_output_tokens"}
		}
	case projections.StatusCancelled:
		o.Status, o.Terminal = "cancelled", true
	case projections.StatusFailed:
		o.Status, o.Terminal = "failed", true
		if p.Failure != nil {
			o.err = map[string]any{"code": p.Failure.Code, "message": p.Failure.Message}
		}
	default:
		o.Status = "queued"
	}
	if o.Terminal {
		in, out := p.PromptTokens(), p.CompletionTokens()
		o.usage = map[string]any{
			"input_tokens": in, "input_tokens_details": map[string]any{"cached_tokens": 0},
			"output_tokens": out, "output_tokens_details": map[string]any{"reasoning_tokens": 0},
			"total_tokens": in + out,
		}
		o.completed = p.CompletedAt
	}
	return o
}

// Finish emits the closing events of a response that ended as o.
func (b *ResponseRender) Finish(o ResponseOutcome) {
	item := "completed"
	if o.Status != "completed" {
		item = "incomplete"
	}
	b.closeOpen(item)
	typ := "response.completed"
	switch o.Status {
	case "failed":
		typ = "response.failed"
	case "incomplete", "cancelled":
		typ = "response.incomplete"
	}
	b.event(typ, func() map[string]any { return map[string]any{"response": b.object(o.Status, &o)} })
}

// object is the response object with the output rendered so far.
func (b *ResponseRender) object(status string, o *ResponseOutcome) map[string]any {
	raw := func(name string, def any) any {
		if v, ok := b.fields[name]; ok && present(v) {
			return v
		}
		return def
	}
	output := make([]map[string]any, 0, len(b.items))
	for _, it := range b.items {
		output = append(output, it.json())
	}
	obj := map[string]any{
		"id": b.public, "object": "response", "created_at": b.acc.Created, "status": status,
		"model": b.acc.Model, "output": output, "background": b.acc.Background,
		"error": nil, "incomplete_details": nil, "usage": nil, "completed_at": nil,
		"instructions":         raw("instructions", nil),
		"max_output_tokens":    raw("max_output_tokens", nil),
		"metadata":             raw("metadata", map[string]any{}),
		"parallel_tool_calls":  raw("parallel_tool_calls", true),
		"previous_response_id": raw("previous_response_id", nil),
		"store":                raw("store", true),
		"temperature":          raw("temperature", 1.0),
		"top_p":                raw("top_p", 1.0),
		"tool_choice":          raw("tool_choice", "auto"),
		"tools":                raw("tools", []any{}),
		"text":                 raw("text", map[string]any{"format": map[string]any{"type": "text"}}),
		"truncation":           "disabled",
		"user":                 raw("user", nil),
	}
	if o != nil {
		// The events before the end name the model asked for, which no
		// later state changes; the end and the object, the model the
		// answer names (the upstream server's, as for chat).
		obj["model"] = o.model
		if o.err != nil {
			obj["error"] = o.err
		}
		if o.incomplete != nil {
			obj["incomplete_details"] = o.incomplete
		}
		if o.usage != nil {
			obj["usage"] = o.usage
		}
		if o.completed > 0 && o.Status == "completed" {
			obj["completed_at"] = o.completed
		}
		if mark := Mark(o.exact); mark != nil && o.Terminal {
			obj[MarkField] = mark
		}
	}
	return obj
}

// ResponseEvents is the number of events of response p's stream so far:
// the sequence number of its next event.
func ResponseEvents(p *projections.Request) int {
	_, n := renderResponse("", p, nil)
	return n
}

// renderResponse renders p, known to its reader as public, whole: every
// event (to emit, if not nil), and the response object as it stands.
func renderResponse(public string, p *projections.Request, emit func(ResponseEvent)) (map[string]any, int) {
	b := NewResponseRender(public, p.Accepted, emit)
	b.Feed(p.Tokens(0), p.Details(0))
	o := b.Outcome(p)
	if o.Terminal {
		b.Finish(o)
	}
	return b.object(o.Status, &o), b.seq
}
