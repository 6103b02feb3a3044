package integration

import (
	"net/http"
	"testing"
)

// BenchmarkConcurrencySlots is what a shared concurrent slot (concurrent=N
// in the budgets file: one compare-and-set of the tenant's key in the
// budgets bucket, and one more to give it back) adds to the time to first
// token, at concurrency 1: streams of one token through one frontend of
// two, a tenant with concurrent=1000 interleaved with one without, 300
// each; the difference of the p50s and of the p90s.
//
//	go test -run '^$' -bench '^BenchmarkConcurrencySlots$' -benchtime 1x ./integration/
func BenchmarkConcurrencySlots(b *testing.B) {
	s := newStack(b)
	args, _ := s.tenantFiles(b, "budgeted concurrent=1000\n", "admin "+adminKey, "budgeted "+benchBudgetedKey, "free "+benchFreeKey)
	f1 := s.frontend(nil, args...)
	s.frontend(nil, args...)
	s.worker("w1", "--mock-tokens-per-sec", "100000", "--mock-ttft", "1ms")
	waitRoutableAs(b, apiClient{f1.url, adminKey}, "w1")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	for b.Loop() {
		with, without := addedTTFT(b, client, f1.url, 300)
		dp50, dp90 := percentile(with, 0.5)-percentile(without, 0.5), percentile(with, 0.9)-percentile(without, 0.9)
		b.Logf("TTFT at concurrency 1, 300 streams each: with concurrent=1000 p50 %v p90 %v, without p50 %v p90 %v: added p50 %v, p90 %v",
			percentile(with, 0.5), percentile(with, 0.9), percentile(without, 0.5), percentile(without, 0.9), dp50, dp90)
		b.ReportMetric(float64(dp50.Microseconds())/1000, "added_ttft_p50_ms")
		b.ReportMetric(float64(dp90.Microseconds())/1000, "added_ttft_p90_ms")
	}
}
