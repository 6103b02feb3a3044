package engine

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/baton-dev/baton/events"
)

// streamChunk is one streamed event of /v1/chat/completions or
// /v1/completions, with vLLM's token-id extensions.
type streamChunk struct {
	Model          string         `json:"model"`
	Choices        []streamChoice `json:"choices"`
	PromptTokenIDs []int          `json:"prompt_token_ids"`
	Usage          *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// streamChoice is one choice of a streamChunk: a completion's text or a
// chat's delta.
type streamChoice struct {
	Text  *string `json:"text"`
	Delta *struct {
		Content          *string         `json:"content"`
		ReasoningContent *string         `json:"reasoning_content"`
		Reasoning        *string         `json:"reasoning"`
		Refusal          *string         `json:"refusal"`
		ToolCalls        json.RawMessage `json:"tool_calls"`
	} `json:"delta"`
	Logprobs       json.RawMessage `json:"logprobs"`
	FinishReason   *string         `json:"finish_reason"`
	TokenIDs       []int           `json:"token_ids"`
	PromptTokenIDs []int           `json:"prompt_token_ids"`
}

// token is the text of the choice and its Details as JSON, nil when it
// carries nothing beyond its text.
func (ch *streamChoice) token() (string, json.RawMessage) {
	var text string
	var d Details
	if ch.Text != nil {
		text = *ch.Text
	}
	if ch.Delta != nil {
		if ch.Delta.Content != nil {
			text = *ch.Delta.Content
		}
		if r := ch.Delta.ReasoningContent; r != nil {
			d.ReasoningContent = *r
		} else if r := ch.Delta.Reasoning; r != nil {
			d.ReasoningContent = *r
		}
		if ch.Delta.Refusal != nil {
			d.Refusal = *ch.Delta.Refusal
		}
		if present(ch.Delta.ToolCalls) {
			d.ToolCalls = ch.Delta.ToolCalls
		}
	}
	if present(ch.Logprobs) {
		d.Logprobs = ch.Logprobs
	}
	var details json.RawMessage
	if d.ToolCalls != nil || d.Logprobs != nil || d.ReasoningContent != "" || d.Refusal != "" {
		details, _ = json.Marshal(d)
	}
	return text, details
}

// Details is what a token carries beyond its text, as the server sent it:
// the chunk's tool_calls delta, logprobs, reasoning and refusal. It is the
// JSON of Token.Details.
type Details struct {
	ToolCalls        json.RawMessage `json:"tool_calls,omitempty"`
	Logprobs         json.RawMessage `json:"logprobs,omitempty"`
	ReasoningContent string          `json:"reasoning_content,omitempty"`
	Refusal          string          `json:"refusal,omitempty"`
}

func present(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// streamReader turns a server's event stream into tokens.
type streamReader struct {
	ctx     context.Context
	budget  int
	emit    func(Token) error
	first   func() // called once, at the first token
	emitted int
	prompt  []int  // prompt ids, to put on the first token
	model   string // the server's model name, to put on the first token
	// maxPrompt, if positive, is the prompt limit checked on the server's
	// prompt ids.
	maxPrompt int
}

func (s *streamReader) token(t Token) (full bool, err error) {
	if s.emitted == s.budget {
		return true, nil
	}
	if err := s.ctx.Err(); err != nil {
		return false, err // nothing more once cancelled, even if buffered
	}
	if s.emitted == 0 {
		s.first()
		t.PromptIDs, t.Model = s.prompt, s.model
	}
	if err := s.emit(t); err != nil {
		return false, emitError{err}
	}
	s.emitted++
	return false, nil
}

// checkPrompt fails a prompt longer than the limit in the server's tokens.
func (s *streamReader) checkPrompt() error {
	if s.maxPrompt > 0 && len(s.prompt) > s.maxPrompt {
		return &UpstreamError{Class: events.FailureClient, Status: http.StatusRequestEntityTooLarge, Code: "prompt_too_large",
			Message: fmt.Sprintf("the prompt is %d tokens (the model server's count), more than the limit of %d", len(s.prompt), s.maxPrompt)}
	}
	return nil
}

// emitError is an error returned by emit.
type emitError struct{ err error }

func (e emitError) Error() string { return e.err.Error() }

// read consumes the stream. A chunk that is not JSON, an error event, and a
// stream that ends with neither a finish reason nor [DONE] are failures.
func (s *streamReader) read(body io.Reader) (Result, error) {
	var res Result
	done := false
	var said string // the last line that was not an event's data: a server's words outside the protocol
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 4096), 4*1024*1024)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data:")
		if !ok {
			said = outsideWords(sc.Text(), said)
			continue // comments, event names, blank separators
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			done = true
			break
		}
		var c streamChunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return res, &UpstreamError{Message: fmt.Sprintf("malformed stream event %.80q: %v", data, err)}
		}
		if present(c.Error) {
			return res, streamError(c.Error)
		}
		full, err := s.chunk(&c, &res)
		if err != nil {
			return res, err
		}
		if full {
			res.FinishReason = FinishLength
			return res, nil
		}
	}
	if err := sc.Err(); err != nil {
		return res, &UpstreamError{Message: fmt.Sprintf("read stream: %v", err)}
	}
	if err := s.ctx.Err(); err != nil {
		return res, err
	}
	switch {
	case res.FinishReason == "" && !done && s.emitted == 0:
		return res, emptyAnswer(said)
	case res.FinishReason == "" && !done:
		return res, &UpstreamError{Message: "stream ended without a finish reason or [DONE]"}
	case res.FinishReason == "" && s.emitted == s.budget:
		res.FinishReason = FinishLength
	case res.FinishReason == "":
		res.FinishReason = FinishStop
	}
	return res, nil
}

// outsideWords keeps line as what the server said outside the stream's
// events, unless it is one of the protocol's own lines (blank, a comment,
// an event name, an id, a retry); said is what it kept before.
func outsideWords(line, said string) string {
	line = strings.TrimSpace(line)
	if line == "" || strings.HasPrefix(line, ":") {
		return said
	}
	for _, field := range []string{"event:", "id:", "retry:"} {
		if strings.HasPrefix(line, field) {
			return said
		}
	}
	return line
}

// emptyAnswer is the failure of a stream that ended before its first token
// with neither a finish reason nor [DONE]. A server that said something
// outside the events (where a request-caused failure may put it) is
// quoted; an error object there is read as an error event in the stream.
func emptyAnswer(said string) *UpstreamError {
	const msg = "the stream ended before the first token, without a finish reason or [DONE]"
	if said == "" {
		return &UpstreamError{Code: events.CodeEmptyAnswer, Message: msg}
	}
	if rest, ok := strings.CutPrefix(said, "error:"); ok {
		said = strings.TrimSpace(rest)
	}
	var obj struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal([]byte(said), &obj) == nil && present(obj.Error) {
		return streamError(obj.Error) // as an error event in the stream
	}
	const most = 300
	if len(said) > most {
		said = said[:most] + "…"
	}
	return &UpstreamError{Code: events.CodeEmptyAnswer, Message: fmt.Sprintf("%s; the server said: %s", msg, said)}
}

// chunk takes in one event of the stream: its usage and prompt token ids
// into res and s, its choices' tokens through emitChoice, their finish reason
// into res. It reports whether the token budget is full.
func (s *streamReader) chunk(c *streamChunk, res *Result) (full bool, err error) {
	if c.Usage != nil {
		res.PromptTokens, res.CompletionTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
	}
	if c.PromptTokenIDs != nil {
		s.prompt = c.PromptTokenIDs
	}
	if s.model == "" {
		s.model = c.Model
	}
	if err := s.checkPrompt(); err != nil {
		return false, err
	}
	for _, ch := range c.Choices {
		if ch.PromptTokenIDs != nil {
			s.prompt = ch.PromptTokenIDs
			if err := s.checkPrompt(); err != nil {
				return false, err
			}
		}
		text, details := ch.token()
		full, err := s.emitChoice(text, details, ch.TokenIDs)
		if err != nil || full {
			return full, err
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			res.FinishReason = *ch.FinishReason
		}
	}
	return false, nil
}

// emitChoice emits one streamed choice: one token per token id when the
// server sent ids (the text and details ride on the first), else one token
// if it has text or details. full reports that the budget was reached
// before all of it was emitted.
func (s *streamReader) emitChoice(text string, details json.RawMessage, ids []int) (full bool, err error) {
	if len(ids) == 0 {
		if text == "" && details == nil {
			return false, nil
		}
		return s.token(Token{Text: text, Details: details})
	}
	for i, id := range ids {
		t := Token{ID: id, HasID: true}
		if i == 0 {
			t.Text, t.Details = text, details
		}
		if full, err := s.token(t); full || err != nil {
			return full, err
		}
	}
	return false, nil
}

// streamError is an error event in a stream: a failure after the response
// began, classified by its code when that is an HTTP status.
func streamError(raw json.RawMessage) *UpstreamError {
	e := &UpstreamError{}
	var inner struct {
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"`
	}
	if json.Unmarshal(raw, &inner) != nil {
		_ = json.Unmarshal(raw, &inner.Message)
	}
	var status int
	if json.Unmarshal(inner.Code, &status) == nil && status >= 400 {
		e.Status = status
		e.Class = ClassOf(status)
	}
	e.Code, e.Message = codeString(inner.Code, inner.Type), inner.Message
	if e.Message == "" {
		e.Message = "error event: " + string(raw)
	}
	if e.Class == "" && e.Code == "content_policy_violation" {
		e.Class = events.FailureClient
	}
	return e
}
