package events_test

import (
	"encoding/json"
	"testing"

	"github.com/baton-dev/baton/events"
)

// The held dispatch's two additions read both ways: a lease or dispatch of
// an older build (no field) reads as not holding, one of this build as
// holding; a reader that knows neither field (an older build's) ignores
// them, as json does an unknown field.
func TestHoldFieldsBothForms(t *testing.T) {
	var old, cur events.Lease
	if err := json.Unmarshal([]byte(`{"worker_id":"w1","lease_id":"L","model":"m","pid":1,"host":"h","ttl_ms":1000}`), &old); err != nil || old.HoldsUntilRouted {
		t.Errorf("an older lease: %+v, %v; want it read as not holding", old, err)
	}
	if err := json.Unmarshal([]byte(`{"worker_id":"w1","lease_id":"L","model":"m","ttl_ms":1000,"holds_until_routed":true}`), &cur); err != nil || !cur.HoldsUntilRouted {
		t.Errorf("a lease of this build: %+v, %v; want it holding", cur, err)
	}
	var d events.Dispatch
	if err := json.Unmarshal([]byte(`{"request_id":"r","attempt":0,"model":"m","prompt":"p","prompt_tokens":1,"start_offset":0,"max_tokens":4,"frontend":"fe"}`), &d); err != nil || d.Hold != "" {
		t.Errorf("an older dispatch: %+v, %v; want it not held", d, err)
	}
	data, _ := json.Marshal(events.Dispatch{RequestID: "r", Model: "m", MaxTokens: 4, Hold: "h1"})
	var older struct { // an older build's view: no hold field
		RequestID string `json:"request_id"`
		MaxTokens int    `json:"max_tokens"`
	}
	if err := json.Unmarshal(data, &older); err != nil || older.RequestID != "r" || older.MaxTokens != 4 {
		t.Errorf("a held dispatch read without the field: %+v, %v", older, err)
	}
	data, _ = json.Marshal(events.Dispatch{RequestID: "r", Model: "m", MaxTokens: 4})
	var m map[string]any
	_ = json.Unmarshal(data, &m)
	if _, ok := m["hold"]; ok {
		t.Errorf("a dispatch that is not held carries hold: %s", data)
	}
}
