package streams_test

import (
	"hash/fnv"
	"strconv"
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
		for _, subj := range []string{streams.RequestEvents(got), streams.RequestTokens(got, 2, "w1")} {
			if s, err := streams.ParseRequestSubject(subj); err != nil || s.ID != got {
				t.Errorf("ParseRequestSubject(%q) = %+v, %v; want id %q", subj, s, err, got)
			}
		}
	}
	for _, bad := range []string{"", "a:", ":a", "a:b:c", "a.b:c", "a:b.c", "a:b c", "a*:b"} {
		if streams.ValidRequestID(bad) {
			t.Errorf("ValidRequestID(%q) = true", bad)
		}
	}
}

// TestRequestSubjects pins the subject layout: a hash slot of the id, the
// id, then "events" or "tokens.<attempt>.<worker>"; the parser reads back
// what the builders wrote, from the stored and the live copies, and
// refuses a subject whose slot is not its id's.
func TestRequestSubjects(t *testing.T) {
	const id = "alice:r1"
	slot := streams.Slot(id)
	if slot < 0 || slot >= streams.Slots {
		t.Fatalf("Slot(%q) = %d, want [0, %d)", id, slot, streams.Slots)
	}
	if streams.Slot(id) != slot {
		t.Fatal("Slot is not a function of the id")
	}
	s := strconv.Itoa(slot)
	if got, want := streams.RequestEvents(id), "baton.requests."+s+".alice:r1.events"; got != want {
		t.Errorf("RequestEvents = %q, want %q", got, want)
	}
	tokens := streams.RequestTokens(id, 3, "w-7")
	if want := "baton.requests." + s + ".alice:r1.tokens.3.w-7"; tokens != want {
		t.Errorf("RequestTokens = %q, want %q", tokens, want)
	}
	if got, want := streams.RequestAll(id), "baton.requests."+s+".alice:r1.>"; got != want {
		t.Errorf("RequestAll = %q, want %q", got, want)
	}
	live := streams.LiveSubject(tokens)
	if want := "baton.live.requests." + s + ".alice:r1.tokens.3.w-7"; live != want {
		t.Errorf("LiveSubject = %q, want %q", live, want)
	}
	if streams.StoredSubject(live) != tokens {
		t.Errorf("StoredSubject(%q) = %q", live, streams.StoredSubject(live))
	}
	for _, subj := range []string{tokens, live} {
		got, err := streams.ParseRequestSubject(subj)
		want := streams.RequestSubject{ID: id, Kind: "tokens", Attempt: 3, Worker: "w-7"}
		if err != nil || got != want || got.Tail() != "tokens.3.w-7" {
			t.Errorf("ParseRequestSubject(%q) = %+v, %v; want %+v", subj, got, err, want)
		}
	}
	if got, err := streams.ParseRequestSubject(streams.RequestEvents(id)); err != nil || got.Kind != "events" || got.Attempt != -1 || got.Tail() != "events" {
		t.Errorf("ParseRequestSubject(events) = %+v, %v", got, err)
	}
	other := strconv.Itoa((slot + 1) % streams.Slots)
	for _, bad := range []string{
		"baton.requests." + other + ".alice:r1.events", // wrong slot
		"baton.requests.alice:r1.events",               // no slot (the old layout)
		"baton.requests." + s + ".alice:r1.tokens.3",   // no worker
		"baton.requests." + s + ".alice:r1.tokens.x.w1",
		"baton.workers.w1.events",
	} {
		if got, err := streams.ParseRequestSubject(bad); err == nil {
			t.Errorf("ParseRequestSubject(%q) = %+v, want an error", bad, got)
		}
	}
}

func TestWorkerOfSubject(t *testing.T) {
	for _, tc := range []struct {
		subj, want string
		ok         bool
	}{
		{streams.WorkerEvents("w1"), "w1", true},
		{"baton.workers.w1.events.x", "", false},
		{"baton.workers.w1.w2.events", "", false},
		{"baton.workers..events", "", false},
		{"baton.requests.0.w1.events", "", false},
		{"", "", false},
	} {
		if got, ok := streams.WorkerOfSubject(tc.subj); got != tc.want || ok != tc.ok {
			t.Errorf("WorkerOfSubject(%q): got %q %v, want %q %v", tc.subj, got, ok, tc.want, tc.ok)
		}
	}
}

func TestWorkerOfQuarantine(t *testing.T) {
	for _, tc := range []struct {
		subj, want string
		ok         bool
	}{
		{streams.WorkerQuarantine("w1"), "w1", true},
		{streams.WorkerEvents("w1"), "", false},
		{"baton.workers.w1.w2.quarantine", "", false},
		{"baton.workers..quarantine", "", false},
		{"", "", false},
	} {
		if got, ok := streams.WorkerOfQuarantine(tc.subj); got != tc.want || ok != tc.ok {
			t.Errorf("WorkerOfQuarantine(%q): got %q %v, want %q %v", tc.subj, got, ok, tc.want, tc.ok)
		}
	}
	if _, ok := streams.WorkerOfSubject(streams.WorkerQuarantine("w1")); ok {
		t.Error("a quarantine subject taken for a worker's events subject")
	}
}

// TestSlotIsFNV1a: the slot of an id is FNV-1a (32 bits) mod Slots, as
// stored subjects since the partitioned log have it.
func TestSlotIsFNV1a(t *testing.T) {
	for _, id := range []string{"", "r1", "alice:r1", "scale-1000x50-0-999", "ü-ñ"} {
		h := fnv.New32a()
		h.Write([]byte(id))
		if got, want := streams.Slot(id), int(h.Sum32()%streams.Slots); got != want {
			t.Errorf("Slot(%q) = %d, want %d", id, got, want)
		}
	}
}

// TestRequestIDOf: the id of every subject ParseRequestSubject reads, and
// no id where it finds none.
func TestRequestIDOf(t *testing.T) {
	const id = "alice:r1"
	s := strconv.Itoa(streams.Slot(id))
	other := strconv.Itoa((streams.Slot(id) + 1) % streams.Slots)
	tokens := streams.RequestTokens(id, 3, "w-7")
	for _, subj := range []string{tokens, streams.LiveSubject(tokens), streams.RequestEvents(id), streams.LiveSubject(streams.RequestEvents(id))} {
		if got, ok := streams.RequestIDOf(subj); !ok || got != id {
			t.Errorf("RequestIDOf(%q) = %q, %v; want %q", subj, got, ok, id)
		}
	}
	for _, bad := range []string{
		"baton.requests." + other + ".alice:r1.events", // wrong slot
		"baton.requests.0" + s + ".alice:r1.events",    // the slot written otherwise
		"baton.requests.alice:r1.events",               // no slot (the old layout)
		"baton.requests." + s + ".alice:r1",            // nothing after the id
		"baton.requests." + s + "..events",
		"baton.workers.w1.events",
	} {
		if got, ok := streams.RequestIDOf(bad); ok {
			t.Errorf("RequestIDOf(%q) = %q, want none", bad, got)
		}
	}
}
