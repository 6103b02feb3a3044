package integration

import (
	"slices"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestBenchEmitTime checks the benchmark's latency probe, measured at the
// ends: a worker run with --bench-emit-time has its mock engine write each
// token's emit time as its text, which reaches the client as any text does;
// a worker without the flag answers the mock's deterministic text.
func TestBenchEmitTime(t *testing.T) {
	s := newStack(t)
	fe := s.frontend(nil)
	s.worker("stamped", "--bench-emit-time", "--mock-tokens-per-sec", "500")
	s.worker("plain", "--mock-tokens-per-sec", "500")
	fe.waitRoutable(t, "stamped", "plain")
	const n = 40
	for _, worker := range []string{"stamped", "plain"} {
		t.Run(worker, func(t *testing.T) {
			prompt := "emit " + worker
			before := time.Now().UnixNano()
			res := postStream(t, fe.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": n},
				map[string]string{"X-Worker-Id": worker}, nil)
			after := time.Now().UnixNano()
			if !res.done {
				t.Fatalf("stream did not end with [DONE]: %q", res.errorBody)
			}
			checkIDs(t, res, 0)
			emits := engine.EmitTimes(nil, res.text)
			if worker == "plain" {
				if want := engine.MockText(prompt, 0, n); res.text != want || len(emits) != 0 {
					t.Errorf("got %q (%d emit times), want the mock's text %q", res.text, len(emits), want)
				}
				return
			}
			if len(emits) != n {
				t.Errorf("%d emit times in the text, want %d: %q", len(emits), n, res.text)
			}
			for _, v := range emits {
				if v < before || v > after {
					t.Errorf("emit time %d: want a Unix ns time within the request (%d..%d)", v, before, after)
				}
			}
			if !slices.IsSorted(emits) {
				t.Errorf("emit times out of order: %v", emits)
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
