package worker_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/services/worker"
	"github.com/baton-dev/baton/streams"
)

// withFields is v's JSON with fields added, as a newer build would send it.
func withFields(t *testing.T, v any, fields map[string]any) []byte {
	t.Helper()
	data, _ := json.Marshal(v)
	var obj map[string]any
	if err := json.Unmarshal(data, &obj); err != nil {
		t.Fatal(err)
	}
	for k, f := range fields {
		obj[k] = f
	}
	data, _ = json.Marshal(obj)
	return data
}

// TestFutureDispatchAndCommands holds the compatibility rule
// (docs/compatibility.md) in the worker: a dispatch from a newer frontend,
// with fields this build does not know, is accepted and served as if they
// were absent; a command of a kind it does not know, or with unknown fields
// around a kind it does not know, is ignored: the generation runs to its
// fault-free end.
func TestFutureDispatchAndCommands(t *testing.T) {
	e := newEnv(t)
	e.start(nil, slow, worker.Config{ID: "w-fut"})
	const prompt, n = "from a newer frontend", 8
	e.accept("r-fut", prompt, n, "w-fut")
	data := withFields(t, newDispatch("r-fut", prompt, n), map[string]any{
		"priority": 3, "placement": map[string]any{"zone": "b"}, "deadline_ms": 1234,
	})
	m, err := e.nc.Request(streams.DispatchSubject("w-fut"), data, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep streams.DispatchReply
	if err := json.Unmarshal(m.Data, &rep); err != nil || !rep.Accepted {
		t.Fatalf("dispatch with unknown fields: %s, %v; want accepted", m.Data, err)
	}
	e.waitFor("first delta", func() bool { return len(e.request("r-fut")) > 2 })
	for _, c := range [][]byte{
		withFields(t, streams.Command{RequestID: "r-fut", Attempt: 0, Kind: "pause"}, map[string]any{"until_ms": 500}),
		withFields(t, streams.Command{RequestID: "r-fut", Attempt: 0, Kind: "reprioritize"}, nil),
	} {
		if err := e.nc.Publish(streams.CommandSubject("w-fut"), c); err != nil {
			t.Fatal(err)
		}
	}
	e.waitFor("completion", func() bool { _, ok := ended(e.request("r-fut")); return ok })
	last, _ := ended(e.request("r-fut"))
	if c, ok := last.Event.(events.RequestCompleted); !ok || c.FinishReason != engine.FinishLength {
		t.Fatalf("outcome %+v, want completed (length): an unknown command stopped the generation", last.Event)
	}
	p := projections.NewRequest()
	for _, ev := range e.request("r-fut") {
		p.Apply(ev)
	}
	if got, want := p.Text(), engine.MockText(prompt, 0, n); got != want {
		t.Errorf("text %q, want %q", got, want)
	}
}
