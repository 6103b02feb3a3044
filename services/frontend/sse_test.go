package frontend

import (
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/baton-dev/baton/internal/promtext"
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

// metric is the sum of the samples of name in reg (a histogram's are
// name_count and name_sum).
func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	v, err := promtext.Gathered(reg, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
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
			count, sum := uint64(metric(t, reg, tc.metric+"_count")), metric(t, reg, tc.metric+"_sum")
			if count != tc.wantCount || sum < tc.wantSum-1e-9 || sum > tc.wantSum+1e-9 {
				t.Errorf("%s: got %d observations summing to %v, want %d summing to %v", tc.name, count, sum, tc.wantCount, tc.wantSum)
			}
		}
		if got := metric(t, reg, "dynamo_frontend_output_tokens_total"); got != 6 {
			t.Errorf("got %v output tokens, want 6", got)
		}
	})
}
