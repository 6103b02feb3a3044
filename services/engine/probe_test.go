package engine_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/vllmsim"
	"github.com/baton-dev/baton/services/engine"
)

func TestSameModel(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"tiny", "tiny", true},
		{"tiny", "tiny:latest", true},
		{"tiny:latest", "tiny", true},
		{"tiny:q4", "tiny", false},
		{"tiny", "tinyllama", false},
	} {
		if got := engine.SameModel(tc.a, tc.b); got != tc.want {
			t.Errorf("SameModel(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestProbeListingIsAdvisory (issue 22, failure 1): a server whose
// /v1/models lists another name than the one it serves is probed ready, the
// listing recorded for the worker's log; a server that does not serve the
// model is not ready in its own words and the listing's.
func TestProbeListingIsAdvisory(t *testing.T) {
	srv := httptest.NewServer(vllmsim.New(vllmsim.Config{Model: "tiny", ListedModel: "tiny:latest"}))
	defer srv.Close()
	for _, tc := range []struct {
		model, match string
	}{{"tiny", "tiny:latest"}, {"tiny:latest", "tiny:latest"}} {
		e, err := engine.NewOpenAI(engine.OpenAIConfig{URL: srv.URL, Model: tc.model})
		if err != nil {
			t.Fatal(err)
		}
		if caps, err := e.Probe(t.Context()); err != nil || !caps.Chat || !caps.Completions {
			t.Fatalf("model %q: Probe = %+v, %v; want chat and completions", tc.model, caps, err)
		}
		if got := e.Listing(); got.Match != tc.match {
			t.Errorf("model %q: listing %+v, want match %q", tc.model, got, tc.match)
		}
	}

	short := httptest.NewServer(vllmsim.New(vllmsim.Config{Model: "org/long-name-v2", ListedModel: "long"}))
	defer short.Close()
	e, _ := engine.NewOpenAI(engine.OpenAIConfig{URL: short.URL, Model: "org/long-name-v2"})
	if _, err := e.Probe(t.Context()); err != nil {
		t.Fatalf("a short listed tag: Probe: %v, want ready (the answers decide)", err)
	}
	if got := e.Listing(); got.Match != "" || len(got.Names) != 1 {
		t.Errorf("listing %+v, want no match among one name", got)
	}

	e, _ = engine.NewOpenAI(engine.OpenAIConfig{URL: srv.URL, Model: "other"})
	_, err := e.Probe(t.Context())
	var ue *engine.UpstreamError
	if !errors.As(err, &ue) || ue.Class != events.FailureNotReady || ue.Status != http.StatusNotFound ||
		!strings.Contains(ue.Message, "does not exist") || !strings.Contains(ue.Message, "tiny:latest") {
		t.Fatalf("unserved model: Probe error %v, want not ready with the server's 404 and its listing", err)
	}
}

// TestProbeTellsBusyFromDead (issue 35): a server that answers the probe's
// requests 429 or 503 is up but busy: the routes that answered exist, with
// no continuation until a later probe, and the error carries its
// Retry-After; one that answers 400 about the request (a content policy, a
// context length) serves; one that answers 404 for the model, or does not
// answer, does not.
func TestProbeTellsBusyFromDead(t *testing.T) {
	for _, tc := range []struct {
		name, fault string
		busy        bool
		retryAfter  time.Duration
	}{
		{"429 with Retry-After", "429:2", true, 2 * time.Second},
		{"503 without", "503", true, 0},
		{"400 content policy", "policy", false, 0},
		{"400 context length", "context", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := vllmsim.ParseFault(tc.fault)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(vllmsim.New(vllmsim.Config{Model: "m", Fault: f, FaultMatch: `"Hello"`}))
			defer srv.Close()
			e, _ := engine.NewOpenAI(engine.OpenAIConfig{URL: srv.URL, Model: "m"})
			caps, err := e.Probe(t.Context())
			var ue *engine.UpstreamError
			switch {
			case tc.busy && (!errors.As(err, &ue) || ue.Class != events.FailureUnavailable || ue.RetryAfter != tc.retryAfter):
				t.Fatalf("Probe error %v, want busy (upstream_unavailable) with Retry-After %v", err, tc.retryAfter)
			case !tc.busy && err != nil:
				t.Fatalf("Probe error %v, want ready: the answer is about the request", err)
			}
			if !caps.Chat || !caps.Completions {
				t.Errorf("caps %+v, want chat and completions (both routes answered)", caps)
			}
			if tc.busy && (caps.Prefill || caps.TokenIDs || !caps.CompletionsNotContinuable) {
				t.Errorf("busy caps %+v, want no continuation until a probe completes", caps)
			}
		})
	}

	e, _ := engine.NewOpenAI(engine.OpenAIConfig{URL: "http://127.0.0.1:1", Model: "m"})
	if _, err := e.Probe(t.Context()); err == nil {
		t.Error("Probe of a refused port: no error, want dead")
	}
}
