package projections_test

import (
	"encoding/json"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

func presence(id string, client uint64) []byte {
	b, _ := json.Marshal(events.FrontendPresence{FrontendID: id, ClientID: client, Server: "S"})
	return b
}

func TestFrontends(t *testing.T) {
	v := projections.NewFrontends()
	for _, tc := range []struct {
		name        string
		u           projections.FrontendUpdate
		wantChanged bool
		wantAlive   bool
	}{
		{"registered", projections.FrontendUpdate{Key: "fe-1", Revision: 1, Value: presence("fe-1", 7)}, true, true},
		{"renewed: no change", projections.FrontendUpdate{Key: "fe-1", Revision: 2, Value: presence("fe-1", 7)}, false, true},
		{"expired", projections.FrontendUpdate{Key: "fe-1", Revision: 3, Deleted: true}, true, false},
		{"deleted again: no change", projections.FrontendUpdate{Key: "fe-1", Revision: 4, Deleted: true}, false, false},
		{"a value that is not a presence is not alive", projections.FrontendUpdate{Key: "fe-1", Revision: 5, Value: []byte("x")}, false, false},
		{"back", projections.FrontendUpdate{Key: "fe-1", Revision: 6, Value: presence("fe-1", 8)}, true, true},
	} {
		if got := v.Apply(tc.u); got != tc.wantChanged {
			t.Errorf("%s: changed = %v, want %v", tc.name, got, tc.wantChanged)
		}
		if got := v.Alive("fe-1"); got != tc.wantAlive {
			t.Errorf("%s: alive = %v, want %v", tc.name, got, tc.wantAlive)
		}
	}
	v.Apply(projections.FrontendUpdate{Key: "fe-2", Revision: 9, Value: presence("fe-2", 8)})
	got := v.ConnectedAs(8, "S")
	if len(got) != 2 || got[0].FrontendID != "fe-1" || got[0].Revision != 6 || got[1].FrontendID != "fe-2" {
		t.Errorf("ConnectedAs(8, S) = %+v, want fe-1 (revision 6) and fe-2", got)
	}
	if got := v.ConnectedAs(7, "S"); len(got) != 0 {
		t.Errorf("ConnectedAs(7, S) = %+v, want none", got)
	}
}

func TestFrontendsMembersAndDeparted(t *testing.T) {
	v := projections.NewFrontends()
	v.Apply(projections.FrontendUpdate{Key: "fe-1", Revision: 1, Value: presence("fe-1", 1)})
	v.Apply(projections.FrontendUpdate{Key: "fe-2", Revision: 2, Value: presence("fe-2", 2)})
	v.Apply(projections.FrontendUpdate{Key: "fe-1", Revision: 3, Deleted: true})
	v.Apply(projections.FrontendUpdate{Key: "fe-3", Revision: 4, Deleted: true}) // never a member
	ids := func(fs []projections.Frontend) (out []string) {
		for _, f := range fs {
			out = append(out, f.FrontendID)
		}
		return out
	}
	if got := ids(v.Members()); len(got) != 1 || got[0] != "fe-2" {
		t.Errorf("members %v, want [fe-2]", got)
	}
	if got := ids(v.Departed()); len(got) != 1 || got[0] != "fe-1" {
		t.Errorf("departed %v, want [fe-1]", got)
	}
	v.Apply(projections.FrontendUpdate{Key: "fe-1", Revision: 5, Value: presence("fe-1", 1)})
	if got := ids(v.Departed()); len(got) != 0 {
		t.Errorf("departed after fe-1 came back: %v, want none", got)
	}
}
