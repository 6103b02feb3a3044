package events_test

import (
	"bytes"
	"reflect"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
)

// FuzzUnmarshal feeds the decoder arbitrary attribute values and data. It must
// never panic, and whatever it decodes must re-marshal and decode to an equal
// envelope (so a reader can always forward or re-append what it read).
func FuzzUnmarshal(f *testing.F) {
	for typ, ev := range samples() {
		h, data, err := events.Marshal(events.Envelope{ID: "id-" + typ, Source: "baton/test", Subject: "r1", Time: when, Event: ev})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(h[events.HeaderSpecVersion][0], h[events.HeaderID][0], h[events.HeaderType][0],
			h[events.HeaderSource][0], h[events.HeaderSubject][0], h[events.HeaderTime][0], data)
	}
	f.Add("1.0", "x", events.TypeWorkerLost, "s", "", "", []byte(`null`))
	f.Add("1.0", "x", events.TypeTokensGenerated, "s", "", "2026-01-01T00:00:00+01:00", []byte(`{"tokens":[]}`))
	f.Add("0.3", " ", "nope", "%zz", " ", "0000-01-01T00:30:00+01:00", []byte(`{`))

	f.Fuzz(func(t *testing.T, spec, id, typ, source, subject, ts string, data []byte) {
		h := events.Header{}
		for k, v := range map[string]string{
			events.HeaderSpecVersion: spec, events.HeaderID: id, events.HeaderType: typ,
			events.HeaderSource: source, events.HeaderSubject: subject, events.HeaderTime: ts,
		} {
			if v != "" {
				h[k] = []string{v}
			}
		}
		roundTrip(t, h, data)
	})
}

// requireEqual compares envelopes: attributes exactly, times as instants, and
// events by their JSON encoding (so a nil and an empty omitempty slice,
// which encode alike, compare equal).
func requireEqual(t *testing.T, got, want events.Envelope) {
	t.Helper()
	if !got.Time.Equal(want.Time) {
		t.Errorf("time = %v, want %v", got.Time, want.Time)
	}
	gd, wd := data(t, got), data(t, want)
	if !bytes.Equal(gd, wd) {
		t.Errorf("data = %s, want %s", gd, wd)
	}
	got.Time, want.Time = time.Time{}, time.Time{}
	got.Event, want.Event = nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("envelope = %#v, want %#v", got, want)
	}
}

func data(t *testing.T, e events.Envelope) []byte {
	t.Helper()
	_, d, err := events.Marshal(e)
	if err != nil {
		t.Fatalf("marshal %#v: %v", e, err)
	}
	return d
}
