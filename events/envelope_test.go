package events_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
)

var when = time.Date(2026, 3, 14, 15, 9, 26, 535897932, time.UTC)

// samples holds one populated value of every registered event type.
func samples() map[string]events.Event {
	return map[string]events.Event{
		events.TypeRequestAccepted: events.RequestAccepted{
			RequestID: "r1", Model: "mock", Endpoint: events.EndpointChat,
			Messages: []events.Message{{Role: "user", Content: "hi"}}, Prompt: "user: hi",
			PromptTokens: 3, MaxTokens: 16, Stream: true, IncludeUsage: true, Created: 1700000000,
			Frontend: "fe-1", ParentID: "p0", PinnedWorker: "w1", Resumable: true,
		},
		events.TypeRequestRouted:    events.RequestRouted{RequestID: "r1", Attempt: 1, WorkerID: "w2", StartOffset: 4},
		events.TypeTokensGenerated:  events.TokensGenerated{RequestID: "r1", Attempt: 1, Offset: 4, Tokens: []string{"a ", "b", "\u00e9"}},
		events.TypeRequestCompleted: events.RequestCompleted{RequestID: "r1", Attempt: 1, FinishReason: "stop", PromptTokens: 3, CompletionTokens: 7},
		events.TypeAttemptFailed:    events.AttemptFailed{RequestID: "r1", Attempt: 0, WorkerID: "w1", Offset: 4, Reason: "engine error"},
		events.TypeAttemptFenced:    events.AttemptFenced{RequestID: "r1", Attempt: 0, Frontend: "fe-2"},
		events.TypeRequestMigrated: events.RequestMigrated{RequestID: "r1", FromAttempt: 0, FromWorker: "w1", Cut: 4,
			MigrationType: events.MigrationOngoingRequest, Reason: "lease lost", Frontend: "fe-2"},
		events.TypeRequestFailed:    events.RequestFailed{RequestID: "r1", Code: "migration_exhausted", Message: "no", Status: 503, Offset: 4},
		events.TypeRequestAttached:  events.RequestAttached{RequestID: "r1", Frontend: "fe-2", Offset: 2},
		events.TypeRequestCancelled: events.RequestCancelled{RequestID: "r1", Mode: events.CancelKill, Reason: "client"},
		events.TypeRequestEnded: events.RequestEnded{RequestID: "r1", Frontend: "fe-1", Through: 7,
			Failed: &events.RequestFailed{RequestID: "r1", Code: "log_full", Message: "full", Status: 503, Offset: 3}},
		events.TypeRequestCompacted:   events.RequestCompacted{RequestID: "r1", Through: 9, Tokens: 2, State: json.RawMessage(`{"v":1,"status":"completed","n":2,"text":"ab","lens":[1,1]}`)},
		events.TypeChildAdded:         events.ChildAdded{RequestID: "r1", ChildID: "r1-0"},
		events.TypeResponseDeleted:    events.ResponseDeleted{RequestID: "r1", Tenant: "alice"},
		events.TypeWorkerRegistered:   events.WorkerRegistered{WorkerID: "w1", LeaseID: "l1", Model: "mock", PID: 42, Host: "h", LeaseTTLMS: 3000, KVBlocks: 64, BlockSize: 16, MaxConcurrent: 8},
		events.TypeWorkerDraining:     events.WorkerDraining{WorkerID: "w1", LeaseID: "l1", Reason: "sigterm"},
		events.TypeWorkerDeregistered: events.WorkerDeregistered{WorkerID: "w1", LeaseID: "l1"},
		events.TypeWorkerLost:         events.WorkerLost{WorkerID: "w1", LeaseID: "l1", Reason: "lease expired"},
	}
}

func TestSamplesCoverRegistry(t *testing.T) {
	got := events.Types()
	slices.Sort(got)
	var want []string
	for typ := range samples() {
		want = append(want, typ)
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("registered types = %v, want samples for exactly %v", got, want)
	}
}

// TestRequestEvents: every request event type says which request it is
// about (its RequestID), and no worker event claims to be about one.
func TestRequestEvents(t *testing.T) {
	for typ, ev := range samples() {
		t.Run(typ, func(t *testing.T) {
			re, ok := ev.(events.RequestEvent)
			if want := strings.HasPrefix(typ, "baton.request."); ok != want {
				t.Fatalf("is a RequestEvent: got %v, want %v", ok, want)
			}
			if !ok {
				return
			}
			if got, want := re.Request(), reflect.ValueOf(ev).FieldByName("RequestID").String(); got != want || got == "" {
				t.Errorf("Request() = %q, want its RequestID %q", got, want)
			}
		})
	}
}

func TestRoundTrip(t *testing.T) {
	for typ, ev := range samples() {
		t.Run(typ, func(t *testing.T) {
			if got := ev.EventType(); got != typ {
				t.Fatalf("EventType() = %q, want %q", got, typ)
			}
			in := events.Envelope{ID: events.ID("r1", 1, uint64(4)), Source: "baton/test/t-1", Subject: "r1", Time: when, Event: ev}
			h, data, err := events.Marshal(in)
			if err != nil {
				t.Fatalf("marshal: %v", err)
			}
			wantHeaders := map[string]string{
				events.HeaderSpecVersion: "1.0",
				events.HeaderID:          "r1.1.4",
				events.HeaderType:        typ,
				events.HeaderSource:      "baton/test/t-1",
				events.HeaderSubject:     "r1",
				events.HeaderTime:        "2026-03-14T15:09:26.535897932Z",
				events.HeaderContentType: "application/json",
				events.HeaderMsgID:       "r1.1.4",
			}
			if typ == events.TypeTokensGenerated { // binary: its text is its data (delta_test.go)
				wantHeaders[events.HeaderContentType] = events.ContentTypeText
				wantHeaders[events.HeaderAttempt] = "1"
				wantHeaders[events.HeaderOffset] = "4"
				wantHeaders[events.HeaderTokenLens] = "2,1,2"
			}
			for k, want := range wantHeaders {
				if got := h[k]; len(got) != 1 || got[0] != want {
					t.Errorf("header %s = %q, want [%q]", k, got, want)
				}
			}
			if len(h) != len(wantHeaders) {
				t.Errorf("got %d headers %v, want %d", len(h), h, len(wantHeaders))
			}
			out, err := events.Unmarshal(h, data)
			if err != nil {
				t.Fatalf("unmarshal: %v", err)
			}
			if !out.Time.Equal(in.Time) {
				t.Errorf("time = %v, want %v", out.Time, in.Time)
			}
			out.Time = in.Time
			if !reflect.DeepEqual(out, in) {
				t.Errorf("round trip:\n got %#v\nwant %#v", out, in)
			}
		})
	}
}

func TestRoundTripOptionalAttributes(t *testing.T) {
	// No subject and no time: ce-subject is left out, ce-time is the zero time.
	in := events.Envelope{ID: "x", Source: "s", Event: events.WorkerDeregistered{WorkerID: "w"}}
	h, data, err := events.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := h[events.HeaderSubject]; ok {
		t.Errorf("got ce-subject %q, want none", h[events.HeaderSubject])
	}
	out, err := events.Unmarshal(h, data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out, in) {
		t.Errorf("got %#v, want %#v", out, in)
	}
}

// TestUnmarshalFutureEvents holds the compatibility rule
// (docs/compatibility.md) at the decoder: hand-made events of a future
// build. Unknown fields of a known type are ignored; an unknown type, a newer
// or a retired version of a known type, and data that does not decode come
// back as an Unreadable with the attributes filled in and a reason, beside
// the error readers already skip on. An Unreadable is never written.
func TestUnmarshalFutureEvents(t *testing.T) {
	base := func(typ, data string) (events.Header, []byte) {
		h, _, err := events.Marshal(events.Envelope{ID: "id-1", Source: "src", Subject: "sub", Time: when, Event: events.WorkerLost{WorkerID: "w"}})
		if err != nil {
			t.Fatal(err)
		}
		h[events.HeaderType] = []string{typ}
		return h, []byte(data)
	}
	for _, tc := range []struct {
		name, typ, data string
		wantErr         error  // nil: decodes
		reason          string // part of the Unreadable's reason
		want            events.Event
	}{
		{name: "unknown field", typ: events.TypeRequestRouted,
			data: `{"request_id":"r","attempt":1,"worker_id":"w2","start_offset":4,"placement":{"zone":"b"},"priority":7}`,
			want: events.RequestRouted{RequestID: "r", Attempt: 1, WorkerID: "w2", StartOffset: 4}},
		{name: "lost of the previous release (no quarantine_ms): a plain lost", typ: events.TypeWorkerLost,
			data: `{"worker_id":"w1","lease_id":"l1","reason":"disconnected"}`,
			want: events.WorkerLost{WorkerID: "w1", LeaseID: "l1", Reason: "disconnected"}},
		{name: "lost with quarantine_ms", typ: events.TypeWorkerLost,
			data: `{"worker_id":"w1","lease_id":"l1","reason":"junk","quarantine_ms":600000}`,
			want: events.WorkerLost{WorkerID: "w1", LeaseID: "l1", Reason: "junk", QuarantineMS: 600000}},
		{name: "unknown type", typ: "baton.request.paused.v1", data: `{"request_id":"r"}`,
			wantErr: events.ErrUnknownType, reason: "unknown event type"},
		{name: "unknown type of another namespace", typ: "baton.worker.teleported.v9", data: `{}`,
			wantErr: events.ErrUnknownType, reason: "unknown event type"},
		{name: "newer version", typ: "baton.request.completed.v2", data: `{"request_id":"r","outcome":{"finish":"stop"}}`,
			wantErr: events.ErrUnknownType, reason: "newer version v2 of baton.request.completed (this build reads up to v1)"},
		{name: "retired version", typ: "baton.request.completed.v0", data: `{"request_id":"r"}`,
			wantErr: events.ErrUnknownType, reason: "version v0 of baton.request.completed is no longer read"},
		{name: "unversioned", typ: "com.example.other", data: `{}`,
			wantErr: events.ErrUnknownType, reason: "not a versioned baton type"},
		{name: "known type, field of another type", typ: events.TypeRequestRouted, data: `{"request_id":"r","attempt":"one","worker_id":"w"}`,
			reason: "data does not decode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, data := base(tc.typ, tc.data)
			e, err := events.Unmarshal(h, data)
			if e.ID != "id-1" || e.Source != "src" || e.Subject != "sub" || !e.Time.Equal(when) {
				t.Errorf("got envelope %#v, want the attributes filled in", e)
			}
			if tc.want != nil {
				if err != nil || !reflect.DeepEqual(e.Event, tc.want) {
					t.Fatalf("got %#v, %v; want %#v", e.Event, err, tc.want)
				}
				return
			}
			if err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Fatalf("got err %v, want %v", err, tc.wantErr)
			}
			u, ok := e.Event.(events.Unreadable)
			if !ok || u.Type != tc.typ || !strings.Contains(u.Reason, tc.reason) || e.Type() != tc.typ {
				t.Fatalf("got event %#v, want an Unreadable of %s whose reason says %q", e.Event, tc.typ, tc.reason)
			}
			if _, _, err := events.Marshal(e); err == nil {
				t.Errorf("Marshal wrote an Unreadable")
			}
		})
	}
}

func TestUnmarshalRejects(t *testing.T) {
	good := func() events.Header {
		return headerOf(t, events.Envelope{ID: "id", Source: "src", Time: when, Event: events.WorkerLost{WorkerID: "w"}})
	}
	tests := []struct {
		name    string
		edit    func(events.Header)
		data    string
		wantErr error // nil: any non-nil error that is neither sentinel
	}{
		{"no headers", func(h events.Header) { clear(h) }, `{}`, events.ErrNotEvent},
		{"no specversion", func(h events.Header) { delete(h, events.HeaderSpecVersion) }, `{}`, events.ErrNotEvent},
		{"empty specversion", func(h events.Header) { h[events.HeaderSpecVersion] = []string{""} }, `{}`, events.ErrNotEvent},
		{"no id", func(h events.Header) { delete(h, events.HeaderID) }, `{}`, events.ErrNotEvent},
		{"no source", func(h events.Header) { delete(h, events.HeaderSource) }, `{}`, events.ErrNotEvent},
		{"no type", func(h events.Header) { delete(h, events.HeaderType) }, `{}`, events.ErrNotEvent},
		{"bad time", func(h events.Header) { h[events.HeaderTime] = []string{"yesterday"} }, `{}`, nil},
		// Regressions found by FuzzUnmarshal: attributes Marshal would refuse.
		{"source not a URI-reference", func(h events.Header) { h[events.HeaderSource] = []string{"#"} }, `{}`, events.ErrNotEvent},
		{"blank id", func(h events.Header) { h[events.HeaderID] = []string{" \t"} }, `{}`, events.ErrNotEvent},
		{"time before year 0 in UTC", func(h events.Header) { h[events.HeaderTime] = []string{"0000-01-01T00:30:00+01:00"} }, `{}`, events.ErrNotEvent},
		{"bad json", func(events.Header) {}, `{"worker_id":`, nil},
		{"invalid routed", func(h events.Header) { h[events.HeaderType] = []string{events.TypeRequestRouted} }, `{"attempt":-1,"worker_id":"w"}`, nil},
		{"invalid accepted", func(h events.Header) { h[events.HeaderType] = []string{events.TypeRequestAccepted} }, `{"model":"m"}`, nil},
		{"accepted routing a later attempt", func(h events.Header) { h[events.HeaderType] = []string{events.TypeRequestAccepted} },
			`{"request_id":"r","model":"m","route":{"request_id":"r","attempt":1,"worker_id":"w","start_offset":0}}`, nil},
		{"accepted routing another request", func(h events.Header) { h[events.HeaderType] = []string{events.TypeRequestAccepted} },
			`{"request_id":"r","model":"m","route":{"request_id":"q","attempt":0,"worker_id":"w","start_offset":0}}`, nil},
		{"negative tokens offset", func(h events.Header) { h[events.HeaderType] = []string{events.TypeTokensGenerated} }, `{"offset":-2}`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := good()
			tt.edit(h)
			_, err := events.Unmarshal(h, []byte(tt.data))
			switch {
			case err == nil:
				t.Fatal("got nil error")
			case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
				t.Errorf("got err %v, want %v", err, tt.wantErr)
			case tt.wantErr == nil && (errors.Is(err, events.ErrNotEvent) || errors.Is(err, events.ErrUnknownType)):
				t.Errorf("got err %v, want a decode error", err)
			}
		})
	}
}

func TestMarshalRejectsInvalidEnvelopes(t *testing.T) {
	ev := events.WorkerLost{WorkerID: "w"}
	tests := []struct {
		name string
		in   events.Envelope
	}{
		{"nil event", events.Envelope{ID: "id", Source: "src"}},
		{"empty id", events.Envelope{Source: "src", Event: ev}},
		{"blank id", events.Envelope{ID: "  ", Source: "src", Event: ev}},
		{"empty source", events.Envelope{ID: "id", Event: ev}},
		{"unparsable source", events.Envelope{ID: "id", Source: "%zz", Event: ev}},
		{"year out of range", events.Envelope{ID: "id", Source: "src", Time: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), Event: ev}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if h, data, err := events.Marshal(tt.in); err == nil {
				t.Errorf("got headers %v data %s, want error", h, data)
			}
		})
	}
}

func TestID(t *testing.T) {
	tests := []struct {
		name  string
		parts []any
		want  string
	}{
		{"none", nil, ""},
		{"string", []any{"r1"}, "r1"},
		{"token delta", []any{"r1", 2, 130}, "r1.2.130"},
		{"uint64", []any{"w", uint64(18446744073709551615)}, "w.18446744073709551615"},
		{"negative int", []any{"r", -1}, "r.-1"},
		{"other types", []any{"r", true, int64(7), 1.5}, "r.true.7.1.5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := events.ID(tt.parts...)
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			if again := events.ID(tt.parts...); again != got {
				t.Errorf("second call got %q, want %q (deterministic)", again, got)
			}
		})
	}
}

// headerOf is the headers Marshal writes for e.
func headerOf(t *testing.T, e events.Envelope) events.Header {
	t.Helper()
	h, _, err := events.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return h
}
