package events_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	cloudevent "github.com/cloudevents/sdk-go/v2/event"
)

func TestDeltaBinaryForm(t *testing.T) {
	enc, err := events.NewDeltaEncoder("baton/worker/w1", "r1", 2)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		ev       events.TokensGenerated
		wantCT   string
		wantData string
		want     map[string]string // headers beyond the common ones; "" means absent
	}{
		{"one token", events.TokensGenerated{RequestID: "r1", Attempt: 2, Offset: 17, Tokens: []string{"upon "}},
			events.ContentTypeText, "upon ",
			map[string]string{events.HeaderOffset: "17", events.HeaderAttempt: "2", events.HeaderTokenLens: "", events.HeaderTokenIDs: ""}},
		{"tokens and ids", events.TokensGenerated{RequestID: "r1", Attempt: 2, Offset: 0,
			Tokens: []string{"a", "", "héllo"}, IDs: []int{5, 0, 77}},
			events.ContentTypeText, "ahéllo",
			map[string]string{events.HeaderTokenLens: "1,0,6", events.HeaderTokenIDs: "5,0,77"}},
		{"an empty token", events.TokensGenerated{RequestID: "r1", Attempt: 2, Offset: 3, Tokens: []string{""}},
			events.ContentTypeText, "", map[string]string{events.HeaderTokenLens: ""}},
		{"details: json", events.TokensGenerated{RequestID: "r1", Attempt: 2, Offset: 3, Tokens: []string{"x"},
			Details: []json.RawMessage{json.RawMessage(`{"finish_reason":"stop"}`)}},
			"application/json", `{"request_id":"r1","attempt":2,"offset":3,"tokens":["x"],"details":[{"finish_reason":"stop"}]}`,
			map[string]string{events.HeaderOffset: ""}},
		{"prompt ids: json", events.TokensGenerated{RequestID: "r1", Attempt: 2, Offset: 0, Tokens: []string{"x"}, PromptIDs: []int{1, 2}},
			"application/json", `{"request_id":"r1","attempt":2,"offset":0,"tokens":["x"],"prompt_ids":[1,2]}`, nil},
		{"no token: json", events.TokensGenerated{RequestID: "r1", Attempt: 2, Offset: 3, Tokens: []string{}},
			"application/json", `{"request_id":"r1","attempt":2,"offset":3,"tokens":[]}`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, data, err := enc.Encode("r1.2.17", when, tt.ev)
			if err != nil {
				t.Fatal(err)
			}
			for k, want := range map[string]string{
				events.HeaderSpecVersion: "1.0", events.HeaderType: events.TypeTokensGenerated,
				events.HeaderSource: "baton/worker/w1", events.HeaderSubject: "r1", events.HeaderID: "r1.2.17",
				events.HeaderMsgID: "r1.2.17", events.HeaderTime: "2026-03-14T15:09:26.535897932Z",
				events.HeaderContentType: tt.wantCT,
			} {
				if got := h[k]; len(got) != 1 || got[0] != want {
					t.Errorf("header %s = %q, want [%q]", k, got, want)
				}
			}
			for k, want := range tt.want {
				if got := strings.Join(h[k], ","); got != want {
					t.Errorf("header %s = %q, want %q", k, got, want)
				}
			}
			if string(data) != tt.wantData {
				t.Errorf("data = %s, want %s", data, tt.wantData)
			}
			// Marshal writes the same, and both read back.
			mh, mdata, err := events.Marshal(events.Envelope{ID: "r1.2.17", Source: "baton/worker/w1", Subject: "r1", Time: when, Event: tt.ev})
			if err != nil || !reflect.DeepEqual(mh, h) || string(mdata) != string(data) {
				t.Errorf("Marshal = %v %s %v, want the encoder's %v %s", mh, mdata, err, h, data)
			}
			e, err := events.Unmarshal(h, data)
			if err != nil {
				t.Fatalf("unmarshal: %v", err)
			}
			got := e.Event.(events.TokensGenerated)
			if len(tt.ev.Tokens) == 0 {
				got.Tokens = []string{} // json: [] decodes to an empty slice
			}
			if !reflect.DeepEqual(got, tt.ev) {
				t.Errorf("read back %#v, want %#v", got, tt.ev)
			}
		})
	}
}

// TestDeltaStoredJSON: deltas stored before the binary form (JSON data)
// still read.
func TestDeltaStoredJSON(t *testing.T) {
	h := events.Header{
		events.HeaderSpecVersion: {"1.0"}, events.HeaderID: {"r1.0.0"}, events.HeaderType: {events.TypeTokensGenerated},
		events.HeaderSource: {"baton/worker/w1"}, events.HeaderSubject: {"r1"}, events.HeaderTime: {"2026-11-29T10:48:39.881Z"},
		events.HeaderContentType: {"application/json"}, events.HeaderMsgID: {"r1.0.0"},
	}
	e, err := events.Unmarshal(h, []byte(`{"request_id":"r1","attempt":0,"offset":0,"tokens":["upon ","a "],"ids":[3,4]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := events.TokensGenerated{RequestID: "r1", Tokens: []string{"upon ", "a "}, IDs: []int{3, 4}}
	if !reflect.DeepEqual(e.Event, want) {
		t.Errorf("got %#v, want %#v", e.Event, want)
	}
}

func TestDeltaRejects(t *testing.T) {
	good := func() events.Header {
		return headerOf(t, events.Envelope{ID: "id", Source: "src", Subject: "r1", Time: when,
			Event: events.TokensGenerated{RequestID: "r1", Attempt: 1, Offset: 2, Tokens: []string{"ab", "c"}, IDs: []int{1, 2}}})
	}
	tests := []struct {
		name string
		edit func(events.Header)
		data string
	}{
		{"no subject", func(h events.Header) { delete(h, events.HeaderSubject) }, "abc"},
		{"no attempt", func(h events.Header) { delete(h, events.HeaderAttempt) }, "abc"},
		{"negative attempt", func(h events.Header) { h[events.HeaderAttempt] = []string{"-1"} }, "abc"},
		{"bad offset", func(h events.Header) { h[events.HeaderOffset] = []string{"x"} }, "abc"},
		{"negative offset", func(h events.Header) { h[events.HeaderOffset] = []string{"-3"} }, "abc"},
		{"lengths past the data", func(events.Header) {}, "ab"},
		{"lengths short of the data", func(events.Header) {}, "abcd"},
		{"negative length", func(h events.Header) { h[events.HeaderTokenLens] = []string{"-1,4"} }, "abc"},
		{"one length", func(h events.Header) { h[events.HeaderTokenLens] = []string{"3"} }, "abc"},
		{"ids do not match", func(h events.Header) { h[events.HeaderTokenIDs] = []string{"1"} }, "abc"},
		{"bad ids", func(h events.Header) { h[events.HeaderTokenIDs] = []string{"1,x"} }, "abc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := good()
			tt.edit(h)
			e, err := events.Unmarshal(h, []byte(tt.data))
			if err == nil || errors.Is(err, events.ErrNotEvent) || errors.Is(err, events.ErrUnknownType) {
				t.Errorf("got %#v, %v; want a decode error", e.Event, err)
			}
		})
	}
}

func TestDeltaEncoderRejects(t *testing.T) {
	if _, err := events.NewDeltaEncoder("%zz", "r1", 0); err == nil {
		t.Error("bad source: got nil error")
	}
	if _, err := events.NewDeltaEncoder("s", " ", 0); err == nil {
		t.Error("blank request id: got nil error")
	}
	enc, err := events.NewDeltaEncoder("s", "r1", 0)
	if err != nil {
		t.Fatal(err)
	}
	for name, ev := range map[string]events.TokensGenerated{
		"another request": {RequestID: "r2", Tokens: []string{"a"}},
		"another attempt": {RequestID: "r1", Attempt: 1, Tokens: []string{"a"}},
	} {
		if _, _, err := enc.Encode("id", when, ev); err == nil {
			t.Errorf("%s: got nil error", name)
		}
	}
	if _, _, err := enc.Encode(" ", when, events.TokensGenerated{RequestID: "r1", Tokens: []string{"a"}}); err == nil {
		t.Error("blank id: got nil error")
	}
	if _, _, err := enc.Encode("id", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), events.TokensGenerated{RequestID: "r1", Tokens: []string{"a"}}); err == nil {
		t.Error("year 10000: got nil error")
	}
}

// extensionEmitNS is an extension attribute this package does not read
// (once a benchmark's emit time, which the mock engine now writes as its
// text): a delta carrying it decodes as one without it.
const extensionEmitNS = "ce-emitns"

// FuzzDelta feeds the binary delta decoder arbitrary extension attributes
// and data: it never panics, and what it reads re-marshals to an equal event.
func FuzzDelta(f *testing.F) {
	f.Add("r1", "0", "17", "", "", "", events.ContentTypeText, []byte("upon "))
	f.Add("r1", "2", "0", "1,0,6", "5,0,77", "42", events.ContentTypeText, []byte("ahéllo"))
	f.Add("r1", "1", "3", "2,2", "", "", "text/plain", []byte("ab\xff\xfe"))
	f.Add("r1", "0", "0", "", "", "", "application/json", []byte(`{"request_id":"r1","tokens":["a"]}`))
	f.Add(" ", "+1", "-0", ",", "1,", "0", events.ContentTypeText, []byte(""))
	f.Fuzz(func(t *testing.T, subject, attempt, offset, lens, ids, emit, ct string, data []byte) {
		h := events.Header{
			events.HeaderSpecVersion: {"1.0"}, events.HeaderID: {"id"}, events.HeaderType: {events.TypeTokensGenerated},
			events.HeaderSource: {"baton/worker/w1"}, events.HeaderTime: {"2026-11-29T10:48:39.881Z"},
		}
		for k, v := range map[string]string{
			events.HeaderSubject: subject, events.HeaderAttempt: attempt, events.HeaderOffset: offset,
			events.HeaderTokenLens: lens, events.HeaderTokenIDs: ids, extensionEmitNS: emit, events.HeaderContentType: ct,
		} {
			if v != "" {
				h[k] = []string{v}
			}
		}
		roundTrip(t, h, data)
	})
}

// roundTrip checks that what Unmarshal reads from h and data (if anything)
// marshals and reads back equal.
func roundTrip(t *testing.T, h events.Header, data []byte) {
	t.Helper()
	e1, err := events.Unmarshal(h, data)
	if err != nil {
		return
	}
	if e1.Event == nil || e1.Type() != h[events.HeaderType][0] {
		t.Fatalf("decoded without error but event = %#v, want type %q", e1.Event, h[events.HeaderType][0])
	}
	h2, data2, err := events.Marshal(e1)
	if err != nil {
		t.Fatalf("decoded %#v but re-marshal failed: %v", e1, err)
	}
	e2, err := events.Unmarshal(h2, data2)
	if err != nil {
		t.Fatalf("re-marshalled %v %q but decode failed: %v", h2, data2, err)
	}
	requireEqual(t, e2, e1)
}

// FuzzValidate holds the package's attribute check to the CloudEvents SDK's:
// the same id, type and source are valid for both.
func FuzzValidate(f *testing.F) {
	f.Add("id", "t", "baton/worker/w1", "r1")
	f.Add(" ", "t", "s", "")
	f.Add("x", "t", "%zz", " ")
	f.Add("x", "t", "#", "s")
	f.Add("x", "\t", "http://[::1]:namedport", "s")
	f.Fuzz(func(t *testing.T, id, typ, source, subject string) {
		ce := cloudevent.New(cloudevent.CloudEventsVersionV1)
		ce.SetID(id)
		ce.SetType(typ)
		ce.SetSource(source)
		if subject != "" {
			ce.SetSubject(subject)
		}
		ce.SetTime(when)
		ce.SetDataContentType("application/json")
		sdk := ce.Validate()
		_, _, err := events.Marshal(events.Envelope{ID: id, Source: source, Subject: subject, Time: when, Event: typed(typ)})
		if (sdk == nil) != (err == nil) {
			t.Fatalf("id %q type %q source %q subject %q: SDK says %v, Marshal says %v", id, typ, source, subject, sdk, err)
		}
	})
}

// typed is an event whose EventType is typ.
type typed string

func (t typed) EventType() string { return string(t) }

// BenchmarkDeltaEncode is the worker's cost of one single-token delta at
// decode rates, headers and all.
func BenchmarkDeltaEncode(b *testing.B) {
	enc, err := events.NewDeltaEncoder("baton/worker/w1", "r1", 0)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h, _, err := enc.Encode("r1.0.1", now, events.TokensGenerated{RequestID: "r1", Offset: i, Tokens: []string{"word "}, IDs: []int{i}})
		if err != nil {
			b.Fatal(err)
		}
		h["x-upstream-ttft"] = []string{"1"} // as a worker adds to its first delta
	}
}

// BenchmarkDeltaDecode is a reader's cost of one single-token delta, its
// headers already parsed (as nats.go hands them over).
func BenchmarkDeltaDecode(b *testing.B) {
	enc, err := events.NewDeltaEncoder("baton/worker/w1", "r1", 0)
	if err != nil {
		b.Fatal(err)
	}
	h, data, err := enc.Encode("r1.0.1", time.Now(), events.TokensGenerated{RequestID: "r1", Offset: 7, Tokens: []string{"word "}, IDs: []int{7}})
	if err != nil {
		b.Fatal(err)
	}
	for k, v := range map[string]string{ // what RePublish adds
		"Nats-Stream": "BATON_REQUESTS", "Nats-Subject": "baton.requests.1.r1.tokens.0.w1", "Nats-Sequence": "123456",
		"Nats-Time-Stamp": "2026-12-01T11:00:00.123456789Z", "Nats-Last-Sequence": "123400",
	} {
		h[k] = []string{v}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := events.Unmarshal(h, data); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDeltaTimeAsMarshalText: a delta's ce-time is what the other events'
// (time.MarshalText in UTC) is, to the byte, and a year MarshalText refuses
// is refused.
func TestDeltaTimeAsMarshalText(t *testing.T) {
	enc, err := events.NewDeltaEncoder("s", "r1", 0)
	if err != nil {
		t.Fatal(err)
	}
	paris := time.FixedZone("CET", 3600)
	for _, at := range []time.Time{
		when,
		time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC),            // no fraction
		time.Date(2026, 12, 1, 14, 0, 0, 120000000, time.UTC),    // trailing zeros
		time.Date(2026, 12, 1, 15, 0, 0, 123456789, paris),       // another zone
		time.Date(0, 1, 1, 0, 0, 0, 1, time.UTC),                 // the first year
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC), // the last
	} {
		want, err := at.UTC().MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		h, _, err := enc.Encode("id", at, events.TokensGenerated{RequestID: "r1", Tokens: []string{"a"}})
		if err != nil {
			t.Fatalf("%v: %v", at, err)
		}
		if got := h[events.HeaderTime]; len(got) != 1 || got[0] != string(want) {
			t.Errorf("%v: ce-time %q, want %q", at, got, want)
		}
	}
	for _, at := range []time.Time{time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)} {
		if _, err := at.UTC().MarshalText(); err == nil {
			t.Fatalf("MarshalText accepts %v", at)
		}
		if _, _, err := enc.Encode("id", at, events.TokensGenerated{RequestID: "r1", Tokens: []string{"a"}}); err == nil {
			t.Errorf("%v: got nil error, want the year refused as MarshalText refuses it", at)
		}
	}
}

// TestDeltaEncodeInto: a delta encoded into the map of the one before it
// (with a header a worker added to that one) has exactly Encode's headers.
func TestDeltaEncodeInto(t *testing.T) {
	enc, err := events.NewDeltaEncoder("baton/worker/w1", "r1", 0)
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := enc.EncodeInto(nil, "r1.0.0", when, events.TokensGenerated{RequestID: "r1", Tokens: []string{"a", "b"}, IDs: []int{1, 2}})
	if err != nil {
		t.Fatal(err)
	}
	h["x-upstream-ttft"] = []string{"1"} // as a worker adds to its first delta
	for _, ev := range []events.TokensGenerated{
		{RequestID: "r1", Offset: 2, Tokens: []string{"c"}},                                           // binary, fewer attributes
		{RequestID: "r1", Offset: 3, Tokens: []string{"d"}, Details: []json.RawMessage{[]byte(`{}`)}}, // JSON
	} {
		want, wantData, err := enc.Encode("r1.0.x", when, ev)
		if err != nil {
			t.Fatal(err)
		}
		got, data, err := enc.EncodeInto(h, "r1.0.x", when, ev)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) || string(data) != string(wantData) {
			t.Errorf("offset %d: EncodeInto gave %v %q, want Encode's %v %q", ev.Offset, got, data, want, wantData)
		}
		h = got
	}
}
