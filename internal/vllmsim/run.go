package vllmsim

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
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

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
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

func (s *Server) stream(w http.ResponseWriter, r *http.Request, g *generation, f *Fault) {
	ctx := r.Context()
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if flusher != nil {
		flusher.Flush()
	}
	write := func(data string) {
		fmt.Fprintf(w, "data: %s\n\n", data)
		if flusher != nil {
			flusher.Flush()
		}
	}
	send := func(v any) {
		data, _ := json.Marshal(v)
		write(string(data))
	}
	choice := func(c map[string]any) map[string]any {
		e := g.envelope(true)
		e["choices"] = []map[string]any{c}
		return e
	}
	if !sleep(ctx, s.cfg.TTFT) {
		return
	}
	d := newDecoder(g)
	sent, textOff := 0, 0
	callID := "call_" + g.id
	for {
		if f != nil && f.After == sent {
			switch f.Kind {
			case FaultStatus:
				send(statusFault(f).body())
				write("[DONE]")
				return
			case FaultCut:
				panic(http.ErrAbortHandler) // the server drops the connection
			case FaultMalformed:
				write(`{"id": "` + g.id + `", "choices": [{"delta": {"content": "`)
			case FaultNoDone:
				return
			case FaultStall:
				<-ctx.Done()
				return
			}
		}
		if sent == 0 && g.chat {
			c := choice(map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil})
			if g.req.ReturnTokenIDs {
				c["prompt_token_ids"] = g.prompt
			}
			send(c)
		}
		t, finish := d.next()
		if t != nil {
			if sent > 0 && !sleep(ctx, s.cfg.TokenDelay) {
				return
			}
			var c map[string]any
			if g.chat {
				delta := map[string]any{"content": t.text}
				if g.tool != "" {
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
						call["id"], call["type"] = callID, "function"
					}
					delta = map[string]any{"tool_calls": []map[string]any{call}}
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
			textOff += len(t.text)
			sent++
			send(choice(c))
		}
		if finish == "" {
			continue
		}
		if g.chat {
			send(choice(map[string]any{"index": 0, "delta": map[string]any{}, "logprobs": nil, "finish_reason": finish}))
		} else {
			send(choice(map[string]any{"index": 0, "text": "", "logprobs": nil, "finish_reason": finish}))
		}
		if g.req.StreamOptions != nil && g.req.StreamOptions.IncludeUsage {
			e := g.envelope(true)
			e["choices"] = []any{}
			e["usage"] = g.usage(sent)
			send(e)
		}
		write("[DONE]")
		return
	}
}

func (s *Server) unary(w http.ResponseWriter, r *http.Request, g *generation, f *Fault) {
	ctx := r.Context()
	if !sleep(ctx, s.cfg.TTFT) {
		return
	}
	d := newDecoder(g)
	var toks []*token
	var finish string
	for {
		if f != nil && f.After == len(toks) {
			switch f.Kind {
			case FaultStatus:
				writeErr(w, statusFault(f))
				return
			case FaultCut, FaultNoDone:
				panic(http.ErrAbortHandler)
			case FaultMalformed:
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"id": "` + g.id + `", "choices": [`))
				return
			case FaultStall:
				<-ctx.Done()
				return
			}
		}
		t, fin := d.next()
		if t != nil {
			if len(toks) > 0 && !sleep(ctx, s.cfg.TokenDelay) {
				return
			}
			toks = append(toks, t)
		}
		if fin != "" {
			finish = fin
			break
		}
	}
	var text strings.Builder
	ids := make([]int, len(toks))
	for i, t := range toks {
		text.WriteString(t.text)
		ids[i] = t.id
	}
	e := g.envelope(false)
	var c map[string]any
	if g.chat {
		msg := map[string]any{"role": "assistant", "content": text.String()}
		if g.tool != "" && len(toks) > 0 {
			args := toolArgsOpen + text.String()
			if finish == "tool_calls" {
				args += toolArgsClose
			}
			msg["content"] = nil
			msg["tool_calls"] = []map[string]any{{"id": "call_" + g.id, "type": "function",
				"function": map[string]any{"name": g.tool, "arguments": args}}}
		}
		c = map[string]any{"index": 0, "message": msg, "logprobs": nil, "finish_reason": finish}
		if g.logprobs {
			content := make([]map[string]any, len(toks))
			for i, t := range toks {
				content[i] = g.chatLogprob(t)
			}
			c["logprobs"] = map[string]any{"content": content}
		}
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
	writeJSON(w, http.StatusOK, e)
}
