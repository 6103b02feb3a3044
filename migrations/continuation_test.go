package migrations_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/migrations"
	"github.com/baton-dev/baton/projections"
)

// TestContinuationCarriesBodyAndIDs: the next attempt's dispatch carries the
// client's body, and the prompt ids plus the generated ids when every id is
// known, so that an engine continues token-exactly.
func TestContinuationCarriesBodyAndIDs(t *testing.T) {
	body := json.RawMessage(`{"model":"m","messages":[{"role":"user","content":"hi"}],"seed":3}`)
	build := func(ids []int) *projections.Request {
		r := projections.NewRequest()
		r.Apply(events.Envelope{Event: events.RequestAccepted{RequestID: "r", Model: "m", Endpoint: events.EndpointChat, Prompt: "user: hi", PromptTokens: 2, MaxTokens: 10, Body: body}})
		r.Apply(events.Envelope{Event: events.RequestRouted{RequestID: "r", Attempt: 0, WorkerID: "w0"}})
		r.Apply(events.Envelope{Event: events.TokensGenerated{RequestID: "r", Attempt: 0, Tokens: []string{" a", " b"}, IDs: ids, PromptIDs: []int{7, 8, 9}}})
		r.Apply(events.Envelope{Event: events.RequestMigrated{RequestID: "r", FromAttempt: 0, Cut: 2, MigrationType: events.MigrationOngoingRequest}})
		return r
	}
	d := migrations.Continuation(build([]int{40, 41}), 1, "fe")
	if string(d.Body) != string(body) || d.Endpoint != events.EndpointChat || d.StartOffset != 2 || d.Generated != " a b" {
		t.Fatalf("dispatch %+v", d)
	}
	if !reflect.DeepEqual(d.PromptIDs, []int{7, 8, 9}) || !reflect.DeepEqual(d.GeneratedIDs, []int{40, 41}) {
		t.Errorf("ids %v + %v, want [7 8 9] + [40 41]", d.PromptIDs, d.GeneratedIDs)
	}
	if d := migrations.Continuation(build(nil), 1, "fe"); d.PromptIDs != nil || d.GeneratedIDs != nil {
		t.Errorf("ids %v + %v from an engine without ids, want none", d.PromptIDs, d.GeneratedIDs)
	}
}
