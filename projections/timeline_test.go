package projections_test

import (
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

func TestKind(t *testing.T) {
	cases := []struct{ in, want string }{
		{events.TypeRequestMigrated, "migrated"},
		{events.TypeAttemptFailed, "attempt_failed"},
		{events.TypeWorkerLost, "lost"},
		{events.TypeWorkerRegistered, "registered"},
		{"baton.request.future.v2", "future"},
		{"baton.request.noversion", "noversion"},
		{"com.example.other", "com.example.other"},
		{"other.type.v1", "other.type.v1"},
		{"", ""},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			if got := projections.Kind(tc.in); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
