package frontend

import (
	"testing"

	"github.com/baton-dev/baton/events"
)

func TestRequestIDNamespaces(t *testing.T) {
	tests := []struct {
		tenant, id string
		internal   string
		ok         bool
	}{
		{"", "r1", "r1", true},
		{"", "alice:r1", "", false},
		{"alice", "r1", "alice:r1", true},
		{"bob", "r1", "bob:r1", true},
		{"bob", "alice:r1", "", false},
		{"alice", "r.1", "", false},
		{"admin", "r1", "r1", true},
		{"admin", "alice:r1", "alice:r1", true},
		{"admin", "alice:r.1", "", false},
		{"admin", "a:b:c", "", false},
	}
	for _, tt := range tests {
		got, ok := requestID(tt.tenant, tt.id)
		if got != tt.internal || ok != tt.ok {
			t.Errorf("requestID(%q, %q) = %q, %v; want %q, %v", tt.tenant, tt.id, got, ok, tt.internal, tt.ok)
		}
		if ok && publicID(tt.tenant, got) != tt.id {
			t.Errorf("publicID(%q, %q) = %q, want %q", tt.tenant, got, publicID(tt.tenant, got), tt.id)
		}
	}
}

func TestMayAccess(t *testing.T) {
	alices := events.RequestAccepted{Tenant: "alice"}
	open := events.RequestAccepted{}
	for _, tt := range []struct {
		tenant string
		acc    events.RequestAccepted
		want   bool
	}{
		{"alice", alices, true}, {"bob", alices, false}, {"admin", alices, true}, {"", alices, false},
		{"", open, true}, {"bob", open, false}, {"admin", open, true},
	} {
		if got := mayAccess(tt.tenant, tt.acc); got != tt.want {
			t.Errorf("mayAccess(%q, tenant %q) = %v, want %v", tt.tenant, tt.acc.Tenant, got, tt.want)
		}
	}
}
