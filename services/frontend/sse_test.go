package frontend

import (
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestSetWorker(t *testing.T) {
	cases := []struct {
		name, worker, want string
	}{
		{"named", "w-1", "w-1"},
		{"none yet", "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			setWorker(rec, snapshot{worker: tc.worker})
			if got := rec.Header().Get(headerWorkerID); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// histogram is the sample count and sum of the (single) series of histogram
// name in reg.
func histogram(t *testing.T, reg *prometheus.Registry, name string) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatalf("no single series of %s", name)
	return 0, 0
}

// counter is the value of the (single) series of counter name in reg.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no single series of %s", name)
	return 0
}

// TestTokenMetrics: the first tokens observe the time to first token, later
// ones the inter-token latency, one observation per token.
func TestTokenMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		m, err := newMetrics(reg)
		if err != nil {
			t.Fatal(err)
		}
		tm := m.tokens("mock", time.Now())
		time.Sleep(300 * time.Millisecond)
		tm.sent(2)
		time.Sleep(100 * time.Millisecond)
		tm.sent(4)
		time.Sleep(100 * time.Millisecond)
		tm.end()
		cases := []struct {
			name      string
			metric    string
			wantCount uint64
			wantSum   float64
		}{
			{"time to first token: one observation", "dynamo_frontend_time_to_first_token_seconds", 1, 0.3},
			{"inter-token latency: one per later token", "dynamo_frontend_inter_token_latency_seconds", 4, 0.1},
			{"duration: one per response", "dynamo_frontend_request_duration_seconds", 1, 0.5},
		}
		for _, tc := range cases {
			count, sum := histogram(t, reg, tc.metric)
			if count != tc.wantCount || sum < tc.wantSum-1e-9 || sum > tc.wantSum+1e-9 {
				t.Errorf("%s: got %d observations summing to %v, want %d summing to %v", tc.name, count, sum, tc.wantCount, tc.wantSum)
			}
		}
		if got := counter(t, reg, "dynamo_frontend_output_tokens_total"); got != 6 {
			t.Errorf("got %v output tokens, want 6", got)
		}
	})
}
