package openai

import (
	"strconv"
	"testing"
)

// BenchmarkRenderResponse renders a finished response of 4096 tokens: its
// event count alone (count) and every event's JSON (events).
func BenchmarkRenderResponse(b *testing.B) {
	tokens := make([]string, 4096)
	for i := range tokens {
		tokens[i] = "w" + strconv.Itoa(i) + " "
	}
	p, _ := foldResponse(b, `{"model":"m","input":"hi"}`, tokens, nil, []int{4096}, "length")
	b.Run("count", func(b *testing.B) {
		for b.Loop() {
			renderResponse("resp_1", p, nil)
		}
	})
	b.Run("events", func(b *testing.B) {
		for b.Loop() {
			renderResponse("resp_1", p, func(e ResponseEvent) { _ = e.data() })
		}
	})
}
