package events_test

import (
	"encoding/json"
	"testing"

	"github.com/baton-dev/baton/events"
)

// TestLeasePriorityBothForms: a lease of an older build (no priority) reads
// as the default tier 0; a lease of this build carries its tier, omitted at
// 0 so that a default worker's lease is what an older build wrote; a reader
// that does not know the field (an older build's) ignores it.
func TestLeasePriorityBothForms(t *testing.T) {
	var old events.Lease
	if err := json.Unmarshal([]byte(`{"worker_id":"w1","lease_id":"L","model":"m","pid":1,"host":"h","ttl_ms":1000}`), &old); err != nil || old.Priority != 0 {
		t.Errorf("an older lease: %+v, %v; want priority 0", old, err)
	}
	data, _ := json.Marshal(events.Lease{WorkerID: "w1", LeaseID: "L", Model: "m", TTLMS: 1000, Priority: 3})
	var cur events.Lease
	if err := json.Unmarshal(data, &cur); err != nil || cur.Priority != 3 {
		t.Errorf("a lease of this build %s: %+v, %v; want priority 3", data, cur, err)
	}
	var older struct { // an older build's view: no priority field
		WorkerID string `json:"worker_id"`
		TTLMS    int64  `json:"ttl_ms"`
	}
	if err := json.Unmarshal(data, &older); err != nil || older.WorkerID != "w1" || older.TTLMS != 1000 {
		t.Errorf("a lease with a priority read without the field: %+v, %v", older, err)
	}
	data, _ = json.Marshal(events.Lease{WorkerID: "w1", LeaseID: "L", Model: "m", TTLMS: 1000})
	var m map[string]any
	_ = json.Unmarshal(data, &m)
	if _, ok := m["priority"]; ok {
		t.Errorf("a lease of the default tier carries priority: %s", data)
	}
}
