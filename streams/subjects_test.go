package streams_test

import (
	"testing"

	"github.com/baton-dev/baton/streams"
)

func TestTenantRequestIDs(t *testing.T) {
	tests := []struct {
		tenant, id, internal string
	}{
		{"", "r1", "r1"},
		{"admin", "r1", "r1"},
		{"alice", "r1", "alice:r1"},
		{"bob", "r1", "bob:r1"},
		{"alice", "r1-0", "alice:r1-0"},
	}
	for _, tt := range tests {
		got := streams.TenantRequestID(tt.tenant, tt.id)
		if got != tt.internal {
			t.Errorf("TenantRequestID(%q, %q) = %q, want %q", tt.tenant, tt.id, got, tt.internal)
		}
		if !streams.ValidRequestID(got) {
			t.Errorf("%q is not a valid request id", got)
		}
		wantTenant := tt.tenant
		if wantTenant == "admin" {
			wantTenant = ""
		}
		if tenant, id := streams.SplitRequestID(got); tenant != wantTenant || id != tt.id {
			t.Errorf("SplitRequestID(%q) = %q, %q; want %q, %q", got, tenant, id, wantTenant, tt.id)
		}
		// The internal id is one subject token: the subjects parse back to it.
		for _, subj := range []string{streams.RequestEvents(got), streams.RequestTokens(got, 2)} {
			if id, _, _, err := streams.ParseRequestSubject(subj); err != nil || id != got {
				t.Errorf("ParseRequestSubject(%q) = %q, %v; want %q", subj, id, err, got)
			}
		}
	}
	for _, bad := range []string{"", "a:", ":a", "a:b:c", "a.b:c", "a:b.c", "a:b c", "a*:b"} {
		if streams.ValidRequestID(bad) {
			t.Errorf("ValidRequestID(%q) = true", bad)
		}
	}
}
