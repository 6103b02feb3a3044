package integration

import (
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestBenchEmitTime checks the benchmark's latency probe: a worker run with
// --bench-emit-time stamps its deltas, and the frontend passes each token's
// stamp to the SSE client as a comment line before the token's event; a
// worker without the flag adds nothing to the stream.
func TestBenchEmitTime(t *testing.T) {
	s := newStack(t)
	fe := s.frontend(nil)
	s.worker("stamped", "--bench-emit-time", "--mock-tokens-per-sec", "500")
	s.worker("plain", "--mock-tokens-per-sec", "500")
	fe.waitRoutable(t, "stamped", "plain")
	for _, tc := range []struct {
		worker string
		want   int // emit times in the stream
	}{{"stamped", 40}, {"plain", 0}} {
		t.Run(tc.worker, func(t *testing.T) {
			before := time.Now().UnixNano()
			resp := post(t, fe.url+"/v1/completions", map[string]any{"model": "mock", "prompt": "emit " + tc.worker, "max_tokens": 40, "stream": true},
				map[string]string{"X-Worker-Id": tc.worker})
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			after := time.Now().UnixNano()
			var emits []int64
			for line := range strings.Lines(string(body)) {
				if rest, ok := strings.CutPrefix(line, ": emit "); ok {
					for f := range strings.FieldsSeq(rest) {
						v, err := strconv.ParseInt(f, 10, 64)
						if err != nil || v < before || v > after {
							t.Errorf("emit time %q: want a Unix ns time within the request (%d..%d)", f, before, after)
						}
						emits = append(emits, v)
					}
				}
			}
			if len(emits) != tc.want {
				t.Errorf("%d emit times in the stream, want %d:\n%s", len(emits), tc.want, body)
			}
			if !slices.IsSorted(emits) {
				t.Errorf("emit times out of order: %v", emits)
			}
			if !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
				t.Errorf("stream did not end with [DONE]:\n%s", body)
			}
		})
	}
}

// TestBenchLogOff checks the benchmark's log-off baseline: a worker run with
// --bench-log-off streams the whole answer to the client through a frontend,
// and the log stores none of its tokens.
func TestBenchLogOff(t *testing.T) {
	s := newStack(t)
	// Nothing of a log-off request is stored: nothing to compact either.
	fe := s.frontend(nil, "--log-compaction=false")
	s.worker("w1", "--bench-log-off", "--mock-tokens-per-sec", "500")
	fe.waitRoutable(t, "w1")
	const prompt, n = "log off", 50
	res := postStream(t, fe.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": n}, map[string]string{"X-Request-Id": "logoff-1"}, nil)
	if want := engine.MockText(prompt, 0, n); !res.done || res.text != want {
		t.Fatalf("done=%v error=%q\n got %q\nwant %q", res.done, res.errorBody, res.text, want)
	}
	checkIDs(t, res, 0)
	nc, err := nats.Connect(s.natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if stored, deltas, _ := storedTokens(t, js, "logoff-1"); stored != 0 {
		t.Errorf("the log stores %d tokens in %d deltas; want none with the log off", stored, deltas)
	}
}
