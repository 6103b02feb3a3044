package promtext

import (
	"bytes"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// Gathered is Sum over what g gathers now, written as /metrics would write
// it: the unit tests read their own registry the way the integration tests
// read a process's /metrics. A histogram's count and sum are its series
// name_count and name_sum.
func Gathered(g prometheus.Gatherer, name string, labels ...string) (float64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, fmt.Errorf("gather: %w", err)
	}
	var b bytes.Buffer
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			return 0, fmt.Errorf("write %s: %w", mf.GetName(), err)
		}
	}
	return Sum(&b, name, labels...)
}
