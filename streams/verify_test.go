package streams_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDefinitionsAreTheServers: what Provision creates is what Verify
// expects, field by field: the buckets' streams as nats.go defines them, the
// server's defaults and metadata included.
func TestDefinitionsAreTheServers(t *testing.T) {
	for _, cfg := range []streams.Config{{MemoryStorage: true}, {MemoryStorage: true, RequestPartitions: 3}, {}} {
		s := natstest.Start(t)
		js := s.JetStream(t)
		ctx := testCtx(t)
		p, err := streams.Provision(ctx, js, cfg)
		if err != nil {
			t.Fatalf("provision %+v: %v", cfg, err)
		}
		for _, want := range cfg.Definitions(p) {
			st, err := js.Stream(ctx, want.Name)
			if err != nil {
				t.Fatal(err)
			}
			if d := streams.Diff(want, st.CachedInfo().Config); d != nil {
				t.Errorf("%+v: %s: got differences %q, want none", cfg, want.Name, d)
			}
		}
		if got, err := streams.Verify(ctx, js, cfg); err != nil || got != p {
			t.Errorf("verify %+v: got %d, %v; want %d", cfg, got, err, p)
		}
	}
}

// TestProvisionRefusesForeignDefinitions: a stream or bucket that someone
// else created first (formerly a worker credential could) with a definition
// of its own is refused by Provision and Verify alike, naming the field:
// formerly each was accepted as it was.
func TestProvisionRefusesForeignDefinitions(t *testing.T) {
	cfg := streams.Config{MemoryStorage: true}
	requests := cfg.RequestsConfig(1, 0)
	noRepublish := requests
	noRepublish.RePublish = nil
	tiny := requests
	tiny.MaxBytes = 1024
	oldDiscard := requests
	oldDiscard.Discard, oldDiscard.DiscardNewPerSubject = jetstream.DiscardOld, false
	workers := cfg.WorkersConfig()
	unbounded := workers
	unbounded.MaxBytes, unbounded.MaxMsgSize = 0, 0
	var capture jetstream.StreamConfig
	for _, d := range cfg.Definitions(1) {
		if d.Name == "KV_"+streams.FrontendsBucket {
			capture = d
		}
	}
	capture.Subjects = append(capture.Subjects, "baton.live.requests.>")
	for _, tc := range []struct {
		name  string
		first jetstream.StreamConfig
		field string
	}{
		{"a bucket capturing every request's live subjects", capture, "KV_baton_frontends subjects"},
		{"a request stream without RePublish", noRepublish, "BATON_REQUESTS republish"},
		{"a request stream of 1 KiB", tiny, "BATON_REQUESTS max_bytes: the server has 1024"},
		{"a request stream that drops the oldest tokens", oldDiscard, "BATON_REQUESTS discard"},
		{"a workers stream without limits", unbounded, "BATON_WORKERS max_bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := natstest.Start(t)
			js := s.JetStream(t)
			ctx := testCtx(t)
			if _, err := js.CreateStream(ctx, tc.first); err != nil {
				t.Fatal(err)
			}
			_, err := streams.Provision(ctx, js, cfg)
			var de *streams.DefinitionError
			if !errors.As(err, &de) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("provision: got %v, want a DefinitionError naming %q", err, tc.field)
			}
			if _, err := streams.Verify(ctx, js, cfg); !errors.As(err, &de) {
				t.Errorf("verify: got %v, want a DefinitionError", err)
			}
		})
	}
}

// TestWaitProvisioned: a component that may not provision waits, saying so,
// until another provisions, and then has the layout.
func TestWaitProvisioned(t *testing.T) {
	s := natstest.Start(t)
	js := s.JetStream(t)
	ctx := testCtx(t)
	cfg := streams.Config{MemoryStorage: true}
	if _, err := streams.Verify(ctx, js, cfg); !errors.Is(err, streams.ErrMissing) {
		t.Fatalf("verify on an empty server: got %v, want ErrMissing", err)
	}
	waiting := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		done <- streams.WaitProvisioned(ctx, js, cfg, func(err error) { waiting <- err })
	}()
	if err := <-waiting; !errors.Is(err, streams.ErrMissing) {
		t.Errorf("waiting: got %v, want ErrMissing", err)
	}
	if names := streamNames(t, js); len(names) != 0 {
		t.Errorf("waiting created streams %v, want none", names)
	}
	if _, err := streams.Provision(ctx, s.JetStream(t), streams.Config{MemoryStorage: true, RequestPartitions: 2}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("wait: %v", err)
	}
	if p, err := streams.Verify(ctx, js, cfg); err != nil || p != 2 {
		t.Errorf("verify: got %d, %v; want 2 partitions", p, err)
	}
	// A worker started with other --replicas than the log's is refused.
	var de *streams.DefinitionError
	if err := streams.WaitProvisioned(ctx, js, streams.Config{MemoryStorage: true, Replicas: 3}, func(error) {}); !errors.As(err, &de) ||
		!strings.Contains(err.Error(), "BATON_WORKERS replicas: the server has 1, this component 3") {
		t.Errorf("wait with other replicas: got %v, want a DefinitionError naming replicas", err)
	}
	// A log the previous release provisioned has no budgets bucket, which a
	// worker does not read: it starts.
	if err := js.DeleteStream(ctx, "KV_"+streams.BudgetsBucket); err != nil {
		t.Fatal(err)
	}
	if err := streams.WaitProvisioned(ctx, js, cfg, func(err error) { t.Errorf("waiting without the budgets bucket: %v", err) }); err != nil {
		t.Errorf("wait without the budgets bucket: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := streams.WaitProvisioned(cctx, natstest.Start(t).JetStream(t), cfg, func(error) {}); err == nil {
		t.Error("wait with a cancelled context: got nil, want an error")
	}
}

// TestVerifyRefusesTwoLayouts: a BATON_REQUESTS_0 beside BATON_REQUESTS (a
// race of components with different --request-partitions on a standalone
// server can leave both, TestProvisionRaceOfLayouts) is refused at start
// rather than one of them read silently.
func TestVerifyRefusesTwoLayouts(t *testing.T) {
	s := natstest.Start(t)
	js := s.Provision(t)
	ctx := testCtx(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BATON_REQUESTS_0", Subjects: []string{"stray.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	var de *streams.DefinitionError
	if _, err := streams.Verify(ctx, js, streams.Config{MemoryStorage: true}); !errors.As(err, &de) || !strings.Contains(err.Error(), "two layouts") {
		t.Errorf("verify: got %v, want a DefinitionError naming two layouts", err)
	}
}

// TestWorkersStreamBounded: BATON_WORKERS has a MaxBytes and a small
// message size (formerly neither: one worker credential stored 50 × 1 MiB
// in 0.33 s, and up to about 10 GiB), and a stream of the earlier
// definition is accepted by a worker and bounded in place by Provision.
func TestWorkersStreamBounded(t *testing.T) {
	cfg := streams.Config{MemoryStorage: true}
	if w := cfg.WorkersConfig(); w.MaxBytes != streams.WorkersMaxBytes || w.MaxMsgSize != streams.WorkersMaxMsgSize || w.MaxMsgsPerSubject != streams.WorkersMaxMsgsPerSubject {
		t.Errorf("BATON_WORKERS limits %d bytes, %d per message, %d per subject", w.MaxBytes, w.MaxMsgSize, w.MaxMsgsPerSubject)
	}
	s := natstest.Start(t)
	js := s.JetStream(t)
	ctx := testCtx(t)
	legacy := cfg.WorkersConfig()
	legacy.MaxBytes, legacy.MaxMsgsPerSubject, legacy.MaxMsgSize = -1, 10_000, streams.DefaultMaxMsgSize
	if _, err := js.CreateStream(ctx, legacy); err != nil {
		t.Fatal(err)
	}
	for _, b := range cfg.Definitions(1)[2:] {
		if _, err := js.CreateStream(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := streams.WaitProvisioned(ctx, js, cfg, func(err error) { t.Errorf("waiting: %v", err) }); err != nil {
		t.Errorf("a worker on the earlier BATON_WORKERS: %v", err)
	}
	if _, err := streams.Provision(ctx, js, cfg); err != nil {
		t.Fatalf("provision over the earlier BATON_WORKERS: %v", err)
	}
	st, err := js.Stream(ctx, streams.WorkersStream)
	if err != nil {
		t.Fatal(err)
	}
	if d := streams.Diff(cfg.WorkersConfig(), st.CachedInfo().Config); d != nil {
		t.Errorf("BATON_WORKERS after provision: %q, want bounded", d)
	}
	big := make([]byte, streams.WorkersMaxMsgSize+1)
	if _, err := js.Publish(ctx, streams.WorkerEvents("w1"), big); err == nil {
		t.Error("a message above WorkersMaxMsgSize was stored")
	}
}
