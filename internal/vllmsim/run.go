package vllmsim

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/baton-dev/baton/streams"
)

// toolCallTokens is how many tokens a tool call's arguments take when
// max_tokens allows: then the call ends with finish_reason "tool_calls".
const toolCallTokens = 8

// Tool call arguments are {"input": "<generated text>"}.
const (
	toolArgsOpen  = `{"input": "`
	toolArgsClose = `"}`
)

// token is one generated token as sent: its text may be cut by a stop string.
type token struct {
	step
	text string
}

// decoder runs a generation one token at a time.
type decoder struct {
	g    *generation
	h    contextHash
	ids  []int
	text strings.Builder
}

func newDecoder(g *generation) *decoder { return &decoder{g: g, h: newContext(g.prompt)} }

// next returns the next token, and the finish reason once the answer ends
// (with or without a last token).
func (d *decoder) next() (*token, string) {
	g := d.g
	if len(d.ids) >= g.maxTokens {
		return nil, "length"
	}
	st := g.sampling.next(d.h)
	d.h = d.h.add(st.id)
	d.ids = append(d.ids, st.id)
	t := &token{step: st, text: tokenText(st.id)}
	before := d.text.Len()
	d.text.WriteString(t.text)
	if i, ok := stopAt(d.text.String(), g.stops); ok {
		keep := max(0, i-before)
		t.text = t.text[:min(keep, len(t.text))]
		return t, "stop"
	}
	if len(d.ids) == g.maxTokens {
		return t, "length"
	}
	if g.tool != "" && len(d.ids) == toolCallTokens {
		return t, "tool_calls"
	}
	return t, ""
}

func (g *generation) object() (id, obj string) {
	if g.chat {
		return "chatcmpl-" + g.id, "chat.completion"
	}
	return "cmpl-" + g.id, "text_completion"
}

func (g *generation) envelope(stream bool) map[string]any {
	id, obj := g.object()
	if stream && g.chat {
		obj += ".chunk"
	}
	return map[string]any{"id": id, "object": obj, "created": g.created, "model": g.req.Model}
}

func (g *generation) usage(n int) map[string]any {
	return map[string]any{"prompt_tokens": len(g.prompt), "completion_tokens": n, "total_tokens": len(g.prompt) + n}
}

func tokenBytes(s string) []int {
	b := make([]int, len(s))
	for i := range len(s) {
		b[i] = int(s[i])
	}
	return b
}

// chatLogprob is one entry of a chat choice's logprobs.content.
func (g *generation) chatLogprob(t *token) map[string]any {
	top := make([]map[string]any, 0, g.top)
	for _, a := range t.top[:g.top] {
		s := tokenText(a.id)
		top = append(top, map[string]any{"token": s, "logprob": a.logprob, "bytes": tokenBytes(s)})
	}
	return map[string]any{"token": t.text, "logprob": t.logprob, "bytes": tokenBytes(t.text), "top_logprobs": top}
}

// completionLogprobs is a completion choice's logprobs for toks, the first at
// text offset off.
func (g *generation) completionLogprobs(toks []*token, off int) map[string]any {
	texts, lps, offs := []string{}, []float64{}, []int{}
	tops := []map[string]float64{}
	for _, t := range toks {
		texts, lps, offs = append(texts, t.text), append(lps, t.logprob), append(offs, off)
		off += len(t.text)
		m := map[string]float64{}
		for _, a := range t.top[:g.top] {
			m[tokenText(a.id)] = a.logprob
		}
		tops = append(tops, m)
	}
	lp := map[string]any{"tokens": texts, "token_logprobs": lps, "text_offset": offs, "top_logprobs": nil}
	if g.top > 0 {
		lp["top_logprobs"] = tops
	}
	return lp
}

// sseWriter writes server-sent events, each flushed at once when it can be.
type sseWriter struct {
	w       http.ResponseWriter
	flusher http.Flusher
}

// write sends one event with data as it is.
func (sw sseWriter) write(data string) {
	fmt.Fprintf(sw.w, "data: %s\n\n", data)
	if sw.flusher != nil {
		sw.flusher.Flush()
	}
}

// send sends v, JSON-encoded, as one event.
func (sw sseWriter) send(v any) {
	data, _ := json.Marshal(v)
	sw.write(string(data))
}

// chunk wraps one choice in a streamed chunk's envelope.
func (g *generation) chunk(c map[string]any) map[string]any {
	e := g.envelope(true)
	e["choices"] = []map[string]any{c}
	return e
}

func (s *Server) stream(w http.ResponseWriter, r *http.Request, g *generation, f *Fault) {
	ctx := r.Context()
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if flusher != nil {
		flusher.Flush()
	}
	sw := sseWriter{w: w, flusher: flusher}
	if !streams.Sleep(ctx, s.cfg.TTFT) {
		return
	}
	d := newDecoder(g)
	sent, textOff := 0, 0
	for {
		if f != nil && f.After == sent && !streamFault(ctx, sw, g, f) {
			return
		}
		if sent == 0 && g.chat {
			c := g.chunk(map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil})
			if g.req.ReturnTokenIDs {
				c["prompt_token_ids"] = g.prompt
			}
			sw.send(c)
		}
		t, finish := d.next()
		if t != nil {
			if sent > 0 && !streams.Sleep(ctx, s.cfg.TokenDelay) {
				return
			}
			c := g.streamChoice(t, finish, sent, textOff)
			textOff += len(t.text)
			sent++
			sw.send(g.chunk(c))
		}
		if finish != "" {
			g.streamEnd(sw, finish, sent)
			return
		}
	}
}

// streamFault injects fault f into a stream; it reports whether the stream
// goes on (after a malformed chunk) rather than ending here.
func streamFault(ctx context.Context, sw sseWriter, g *generation, f *Fault) bool {
	switch f.Kind {
	case FaultStatus:
		sw.send(statusFault(f).body())
		sw.write("[DONE]")
		return false
	case FaultCut:
		panic(http.ErrAbortHandler) // the server drops the connection
	case FaultMalformed:
		sw.write(`{"id": "` + g.id + `", "choices": [{"delta": {"content": "`)
	case FaultNoDone:
		return false
	case FaultStall:
		<-ctx.Done()
		return false
	}
	return true
}

// streamChoice is the choice of the chunk that carries token t, the one after
// sent others, at text offset textOff; finish is the answer's finish reason
// if t is its last token.
func (g *generation) streamChoice(t *token, finish string, sent, textOff int) map[string]any {
	var c map[string]any
	if g.chat {
		delta := map[string]any{"content": t.text}
		if g.tool != "" {
			delta = map[string]any{"tool_calls": []map[string]any{g.toolCallDelta(t, finish, sent)}}
		}
		c = map[string]any{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": nil}
		if g.logprobs {
			c["logprobs"] = map[string]any{"content": []map[string]any{g.chatLogprob(t)}}
		}
	} else {
		c = map[string]any{"index": 0, "text": t.text, "logprobs": nil, "finish_reason": nil}
		if g.logprobs {
			c["logprobs"] = g.completionLogprobs([]*token{t}, textOff)
		}
		if sent == 0 && g.req.ReturnTokenIDs {
			c["prompt_token_ids"] = g.prompt
		}
	}
	if g.req.ReturnTokenIDs {
		c["token_ids"] = []int{t.id}
	}
	return c
}

// toolCallDelta is the tool call of a streamed chat chunk carrying token t:
// the first names the function and opens its arguments, the last closes them.
func (g *generation) toolCallDelta(t *token, finish string, sent int) map[string]any {
	args := t.text
	if sent == 0 {
		args = toolArgsOpen + args
	}
	if finish == "tool_calls" {
		args += toolArgsClose // the call ends with its last token
	}
	fn := map[string]any{"arguments": args}
	call := map[string]any{"index": 0, "function": fn}
	if sent == 0 {
		fn["name"] = g.tool
		call["id"], call["type"] = "call_"+g.id, "function"
	}
	return call
}

// streamEnd ends a stream of sent tokens: the finish reason, the usage if
// asked for, then [DONE].
func (g *generation) streamEnd(sw sseWriter, finish string, sent int) {
	if g.chat {
		sw.send(g.chunk(map[string]any{"index": 0, "delta": map[string]any{}, "logprobs": nil, "finish_reason": finish}))
	} else {
		sw.send(g.chunk(map[string]any{"index": 0, "text": "", "logprobs": nil, "finish_reason": finish}))
	}
	if g.req.StreamOptions != nil && g.req.StreamOptions.IncludeUsage {
		e := g.envelope(true)
		e["choices"] = []any{}
		e["usage"] = g.usage(sent)
		sw.send(e)
	}
	sw.write("[DONE]")
}

func (s *Server) unary(w http.ResponseWriter, r *http.Request, g *generation, f *Fault) {
	ctx := r.Context()
	if !streams.Sleep(ctx, s.cfg.TTFT) {
		return
	}
	d := newDecoder(g)
	var toks []*token
	var finish string
	for {
		if f != nil && f.After == len(toks) && unaryFault(ctx, w, g, f) {
			return
		}
		t, fin := d.next()
		if t != nil {
			if len(toks) > 0 && !streams.Sleep(ctx, s.cfg.TokenDelay) {
				return
			}
			toks = append(toks, t)
		}
		if fin != "" {
			finish = fin
			break
		}
	}
	writeJSON(w, http.StatusOK, g.completion(toks, finish))
}

// unaryFault injects fault f into a non-streamed answer; it reports whether
// that ended the answer.
func unaryFault(ctx context.Context, w http.ResponseWriter, g *generation, f *Fault) bool {
	switch f.Kind {
	case FaultStatus:
		writeErr(w, statusFault(f))
	case FaultCut, FaultNoDone:
		panic(http.ErrAbortHandler)
	case FaultMalformed:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id": "` + g.id + `", "choices": [`))
	case FaultStall:
		<-ctx.Done()
	default:
		return false
	}
	return true
}

// completion is the body of a non-streamed answer of toks.
func (g *generation) completion(toks []*token, finish string) map[string]any {
	var text strings.Builder
	ids := make([]int, len(toks))
	for i, t := range toks {
		text.WriteString(t.text)
		ids[i] = t.id
	}
	e := g.envelope(false)
	var c map[string]any
	if g.chat {
		c = g.chatChoice(toks, text.String(), finish)
		if g.req.ReturnTokenIDs {
			e["prompt_token_ids"] = g.prompt
		}
	} else {
		c = map[string]any{"index": 0, "text": text.String(), "logprobs": nil, "finish_reason": finish}
		if g.logprobs {
			c["logprobs"] = g.completionLogprobs(toks, 0)
		}
		if g.req.ReturnTokenIDs {
			c["prompt_token_ids"] = g.prompt
		}
	}
	if g.req.ReturnTokenIDs {
		c["token_ids"] = ids
	}
	e["choices"] = []map[string]any{c}
	e["usage"] = g.usage(len(toks))
	return e
}

// chatChoice is the choice of a non-streamed chat answer of toks, whose text
// is text: a message, or a tool call when a tool was asked for.
func (g *generation) chatChoice(toks []*token, text, finish string) map[string]any {
	msg := map[string]any{"role": "assistant", "content": text}
	if g.tool != "" && len(toks) > 0 {
		args := toolArgsOpen + text
		if finish == "tool_calls" {
			args += toolArgsClose
		}
		msg["content"] = nil
		msg["tool_calls"] = []map[string]any{{"id": "call_" + g.id, "type": "function",
			"function": map[string]any{"name": g.tool, "arguments": args}}}
	}
	c := map[string]any{"index": 0, "message": msg, "logprobs": nil, "finish_reason": finish}
	if g.logprobs {
		content := make([]map[string]any, len(toks))
		for i, t := range toks {
			content[i] = g.chatLogprob(t)
		}
		c["logprobs"] = map[string]any{"content": content}
	}
	return c
}
