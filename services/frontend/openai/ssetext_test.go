package openai

import (
	"bytes"
	"net/http/httptest"
	"testing"

	"github.com/baton-dev/baton/events"
)

// FuzzTextChunk: the text chunk's fast path writes exactly what the map and
// encoding/json path writes, for any text, ids, model and request id.
func FuzzTextChunk(f *testing.F) {
	f.Add("hello ", "world", "r1", "mock", int64(1700000000), 3, 12, true, true)
	f.Add("<a href=\"x\">&", "\u2028\u2029\x00\x1f\t\n\r\b\f\\", "t:r", "m\"", int64(-1), 0, 0, false, false)
	f.Add("\xe2\x82", "\xac\xff", "r", "é", int64(0), 1, 2, true, false)
	f.Fuzz(func(t *testing.T, tok1, tok2, id, model string, created int64, index, offset int, chat, first bool) {
		acc := events.RequestAccepted{RequestID: id, Model: model, Created: created, Endpoint: events.EndpointCompletions}
		if chat {
			acc.Endpoint = events.EndpointChat
		}
		tokens := []string{tok1, tok2}
		slow, fast := httptest.NewRecorder(), httptest.NewRecorder()
		s := NewSSE(slow, acc)
		s.chunk(offset, merge(tokens, nil).chunkChoice(acc.Endpoint, index, first), nil, nil)
		fw := NewSSE(fast, acc)
		fw.textEvent(offset, index, tokens, first)
		fw.textEvent(offset, index, tokens, first) // reused buffers write it again the same
		if want := append(slow.Body.Bytes(), slow.Body.Bytes()...); !bytes.Equal(fast.Body.Bytes(), want) {
			t.Fatalf("fast path\n got %q\nwant %q", fast.Body.Bytes(), want)
		}
	})
}
