package openai

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/baton-dev/baton/events"
)

func TestStartSSE(t *testing.T) {
	rec := httptest.NewRecorder()
	flush := StartSSE(rec)
	if rec.Code != http.StatusOK {
		t.Errorf("got status %d, want 200", rec.Code)
	}
	for k, want := range map[string]string{
		"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
		"Connection": "keep-alive", "X-Accel-Buffering": "no",
	} {
		if got := rec.Header().Get(k); got != want {
			t.Errorf("got %s %q, want %q", k, got, want)
		}
	}
	if rec.Flushed {
		t.Fatal("got flushed before flush was called")
	}
	flush()
	if !rec.Flushed {
		t.Error("got no flush, want the recorder flushed")
	}
}

// failingWriter fails every write after the first n.
type failingWriter struct {
	http.ResponseWriter
	n      int
	writes int
}

func (f *failingWriter) Write(p []byte) (int, error) {
	f.writes++
	if f.writes > f.n {
		return 0, errors.New("broken pipe")
	}
	return f.ResponseWriter.Write(p)
}

func TestSSEWriterStopsAtTheFirstError(t *testing.T) {
	rec := httptest.NewRecorder()
	fw := &failingWriter{ResponseWriter: rec, n: 1}
	s := NewSSE(fw, events.RequestAccepted{RequestID: "r", Model: "m", Endpoint: events.EndpointChat})
	s.Done(1)
	s.Done(2) // fails
	s.Done(3) // not tried
	if s.Err() == nil {
		t.Fatal("got no error, want the write's")
	}
	if fw.writes != 2 {
		t.Errorf("got %d writes, want 2 (none after the failure)", fw.writes)
	}
	if got, want := rec.Body.String(), "id: 1\ndata: [DONE]\n\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestSSEWriter(t *testing.T) {
	for _, tc := range []struct {
		name     string
		endpoint string
		write    func(s *SSE)
		want     []string // the data lines, in order
	}{
		{"chat: the first chunk names the role", events.EndpointChat, func(s *SSE) {
			s.Delta(2, 0, []string{"a b "}, nil, true)
			s.Delta(3, 0, []string{"c "}, nil, false)
			s.Finish(3, 0, "stop", nil)
			s.Done(3)
		}, []string{
			`{"choices":[{"delta":{"content":"a b ","role":"assistant"},"finish_reason":null,"index":0,"logprobs":null}],"created":7,"id":"chatcmpl-r","model":"m","object":"chat.completion.chunk"}`,
			`{"choices":[{"delta":{"content":"c "},"finish_reason":null,"index":0,"logprobs":null}],"created":7,"id":"chatcmpl-r","model":"m","object":"chat.completion.chunk"}`,
			`{"choices":[{"delta":{},"finish_reason":"stop","index":0}],"created":7,"id":"chatcmpl-r","model":"m","object":"chat.completion.chunk"}`,
			`[DONE]`,
		}},
		{"completions: choice index and usage", events.EndpointCompletions, func(s *SSE) {
			s.Delta(1, 1, []string{"a "}, nil, true)
			s.Usage(1, map[string]any{"completion_tokens": 1}, nil)
		}, []string{
			`{"choices":[{"finish_reason":null,"index":1,"logprobs":null,"text":"a "}],"created":7,"id":"cmpl-r","model":"m","object":"text_completion"}`,
			`{"choices":[],"created":7,"id":"cmpl-r","model":"m","object":"text_completion","usage":{"completion_tokens":1}}`,
		}},
		{"error event", events.EndpointCompletions, func(s *SSE) {
			s.Error(4, ErrorBody("server_error", "x", "y"))
		}, []string{`{"error":{"code":"x","message":"y","type":"server_error"}}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			s := NewSSE(rec, events.RequestAccepted{RequestID: "r", Model: "m", Endpoint: tc.endpoint, Created: 7})
			tc.write(s)
			var data []string
			for _, ev := range strings.Split(strings.TrimSuffix(rec.Body.String(), "\n\n"), "\n\n") {
				id, d, ok := strings.Cut(ev, "\ndata: ")
				if !ok || !strings.HasPrefix(id, "id: ") {
					t.Fatalf("event %q: want id and data lines", ev)
				}
				data = append(data, d)
			}
			if strings.Join(data, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("data:\n%s\nwant:\n%s", strings.Join(data, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}
