package main

import (
	"regexp"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// registerRuntime registers the Go runtime and process collectors on reg:
// client_golang's default Go metrics, and the heap the last collection
// marked live (runtime/metrics /gc/heap/live:bytes, as go_gc_heap_live_bytes),
// which says what the process holds, where go_memstats_heap_inuse_bytes
// also counts the garbage the next collection will free.
func registerRuntime(reg prometheus.Registerer) {
	reg.MustRegister(
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}
