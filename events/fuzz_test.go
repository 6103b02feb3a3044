package events_test

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"reflect"
	"slices"
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

// FuzzDecodeBatch feeds the batch decoder arbitrary bodies. It must never
// panic, every call after a framing error must return it again, and every
// entry it decodes must be written again by a BatchEncoder and read back
// equal (so a reader can always forward what it read). The seed corpus is
// testdata/fuzz/FuzzDecodeBatch.
func FuzzDecodeBatch(f *testing.F) {
	h := events.Header{
		events.HeaderSpecVersion: {"1.0"}, events.HeaderID: {"w1.1"}, events.HeaderType: {events.TypeTokensBatch},
		events.HeaderSource: {batchSource}, events.HeaderTime: {"2026-03-14T15:09:26.535897932Z"},
		events.HeaderContentType: {events.ContentTypeBatch},
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		d, err := events.DecodeBatch(h, body)
		if err != nil {
			t.Fatal(err)
		}
		for range len(body) + 1 { // each entry takes at least one byte
			e, err := d.Next()
			if errors.Is(err, io.EOF) {
				return
			}
			if errors.Is(err, events.ErrBadBatch) {
				if _, again := d.Next(); again == nil || again.Error() != err.Error() {
					t.Fatalf("after %v: %v", err, again)
				}
				return
			}
			if err != nil {
				if _, ok := e.Event.(events.Unreadable); !ok {
					t.Fatalf("error %v with event %#v, want an Unreadable", err, e.Event)
				}
				continue
			}
			rewrite(t, e)
		}
		t.Fatalf("more entries than bytes in %q", body)
	})
}

// rewrite writes e as the one entry of a new batch and checks that it reads
// back equal.
func rewrite(t *testing.T, e events.Envelope) {
	t.Helper()
	enc, err := events.NewBatchEncoder(e.Source)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range slices.Sorted(maps.Keys(e.Header)) {
		for _, v := range e.Header[k] {
			if err := enc.AppendAttribute(k, v); err != nil {
				t.Fatalf("attribute %s of %#v: %v", k, e, err)
			}
		}
	}
	if err := enc.AppendEvent(e); err != nil {
		t.Fatalf("rewrite %#v: %v", e, err)
	}
	h, body, err := enc.Message(nil, "again")
	if err != nil {
		t.Fatal(err)
	}
	d, err := events.DecodeBatch(h, body)
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.Next()
	if err != nil {
		t.Fatalf("read back %q: %v", body, err)
	}
	requireEqual(t, got, e)
	if got.Time != e.Time {
		t.Errorf("time %#v, want %#v", got.Time, e.Time)
	}
	if _, err := d.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("after the entry: %v, want io.EOF", err)
	}
}
