package promtext

import (
	"errors"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/prometheus/client_golang/prometheus"
)

const exposition = `# HELP baton_requests_total Requests.
# TYPE baton_requests_total counter
baton_requests_total{model="mock",outcome="ok"} 3
baton_requests_total{model="mock",outcome="error"} 2
baton_requests_total{model="other",outcome="ok"} 5
baton_requests_total_created{model="mock"} 1.7e9
baton_up 1
baton_weird{reason="a } b, c=\"d\"",model="mock"} 7
baton_weird{reason="x\nz",other_model="mock"} 11
baton_ts 4 1700000000000

not a sample
baton_bad{model="mock" 9
baton_nan{model="mock"} NaN-ish
`

func TestSum(t *testing.T) {
	cases := []struct {
		name   string
		metric string
		labels []string
		want   float64
	}{
		{name: "every series", metric: "baton_requests_total", want: 10},
		{name: "one label", metric: "baton_requests_total", labels: []string{"model", "mock"}, want: 5},
		{name: "two labels", metric: "baton_requests_total", labels: []string{"model", "mock", "outcome", "ok"}, want: 3},
		{name: "no series matches", metric: "baton_requests_total", labels: []string{"model", "none"}, want: 0},
		{name: "no labels at all", metric: "baton_up", want: 1},
		{name: "a name that prefixes another is not it", metric: "baton_requests", want: 0},
		{name: "a value with a brace, a comma and quotes", metric: "baton_weird", labels: []string{"reason", `a } b, c="d"`}, want: 7},
		{name: "a label whose name ends another's is not it", metric: "baton_weird", labels: []string{"model", "mock"}, want: 7},
		{name: "an escaped newline", metric: "baton_weird", labels: []string{"reason", "x\nz"}, want: 11},
		{name: "a timestamp after the value", metric: "baton_ts", want: 4},
		{name: "unclosed labels are not a sample", metric: "baton_bad", want: 0},
		{name: "a value that is not a number is not a sample", metric: "baton_nan", want: 0},
		{name: "absent", metric: "baton_absent", want: 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Sum(strings.NewReader(exposition), tc.metric, tc.labels...)
			if err != nil || got != tc.want {
				t.Errorf("Sum(%s, %q): got %v, %v, want %v", tc.metric, tc.labels, got, err, tc.want)
			}
		})
	}
}

func TestSums(t *testing.T) {
	got, err := Sums(strings.NewReader(exposition), "baton_requests_total", "baton_up", "baton_absent")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["baton_requests_total"] != 10 || got["baton_up"] != 1 {
		t.Errorf("got %v, want baton_requests_total 10 and baton_up 1, nothing for baton_absent", got)
	}
}

func TestReadError(t *testing.T) {
	boom := errors.New("boom")
	if _, err := Sum(iotest.ErrReader(boom), "x"); !errors.Is(err, boom) {
		t.Errorf("Sum: got %v, want the reader's error", err)
	}
	if _, err := Sums(iotest.ErrReader(boom), "x"); !errors.Is(err, boom) {
		t.Errorf("Sums: got %v, want the reader's error", err)
	}
}

// TestGathered: a registry's counters, gauges and histograms read as their
// exposition does, by labels, and a metric it does not hold sums to 0.
func TestGathered(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "c"}, []string{"model"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h_seconds", Help: "h"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g", Help: "g"})
	reg.MustRegister(c, h, g)
	c.WithLabelValues("mock").Add(3)
	c.WithLabelValues("other").Add(5)
	h.Observe(0.25)
	h.Observe(0.5)
	g.Set(-2)
	cases := []struct {
		name   string
		metric string
		labels []string
		want   float64
	}{
		{"a counter's series", "c_total", []string{"model", "mock"}, 3},
		{"a counter over its series", "c_total", nil, 8},
		{"a histogram's count", "h_seconds_count", nil, 2},
		{"a histogram's sum", "h_seconds_sum", nil, 0.75},
		{"a gauge", "g", nil, -2},
		{"absent", "nope", nil, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Gathered(reg, tc.metric, tc.labels...)
			if err != nil || got != tc.want {
				t.Errorf("got %v, %v; want %v, nil", got, err, tc.want)
			}
		})
	}
}
