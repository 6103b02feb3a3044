package events_test

import (
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
)

const batchSource = "baton/worker/w1"

// asMessage is what today's reader gets for e sent as a message of its own:
// Marshal's headers and data, decoded by Unmarshal (streams.Decode adds
// only the stream position and the headers).
func asMessage(t *testing.T, e events.Envelope) events.Envelope {
	t.Helper()
	h, data, err := events.Marshal(e)
	if err != nil {
		t.Fatalf("marshal %#v: %v", e, err)
	}
	got, err := events.Unmarshal(h, data)
	if err != nil {
		t.Fatalf("unmarshal %#v: %v", e, err)
	}
	return got
}

// readBatch decodes every entry of a batch, failing on any error.
func readBatch(t *testing.T, h events.Header, body []byte) []events.Envelope {
	t.Helper()
	d, err := events.DecodeBatch(h, body)
	if err != nil {
		t.Fatalf("DecodeBatch: %v", err)
	}
	var out []events.Envelope
	for {
		e, err := d.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("entry %d: %v", len(out), err)
		}
		out = append(out, e)
	}
}

// TestBatchEntryAsMessage: every delta, appended to a batch, decodes to
// exactly the envelope (attributes, time, event, deep-equal) that the same
// delta decodes to as its own message, whatever the entries around it.
func TestBatchEntryAsMessage(t *testing.T) {
	yes := true
	t0 := when
	tests := []struct {
		name string
		id   string
		at   time.Time
		ev   events.TokensGenerated
	}{
		{"single token", "r1.0.0", t0, events.TokensGenerated{RequestID: "r1", Offset: 0, Tokens: []string{"Once"}}},
		{"many tokens", "r1.0.1", t0.Add(time.Millisecond), events.TokensGenerated{RequestID: "r1", Offset: 1, Tokens: []string{" upon", " a", " time"}}},
		{"token ids", "r2.3.40", t0.Add(1500 * time.Microsecond), events.TokensGenerated{RequestID: "r2", Attempt: 3, Offset: 40,
			Tokens: []string{"a", "b"}, IDs: []int{0, 151643}}},
		{"one id", "r2.3.42", t0, events.TokensGenerated{RequestID: "r2", Attempt: 3, Offset: 42, Tokens: []string{"c"}, IDs: []int{7}}},
		{"negative id", "r2.3.43", t0, events.TokensGenerated{RequestID: "r2", Attempt: 3, Offset: 43, Tokens: []string{"c"}, IDs: []int{-1}}},
		{"unicode", "alice:r3.1.7", t0.Add(time.Nanosecond), events.TokensGenerated{RequestID: "alice:r3", Attempt: 1, Offset: 7,
			Tokens: []string{"héllo", " 世界", "🙂", "\u00e9"}}},
		{"empty text token", "r1.0.4", t0, events.TokensGenerated{RequestID: "r1", Offset: 4, Tokens: []string{""}}},
		{"empty tokens among others", "r1.0.5", t0, events.TokensGenerated{RequestID: "r1", Offset: 5, Tokens: []string{"", "x", ""}, IDs: []int{1, 2, 3}}},
		{"newlines and spaces", "r1.0.8", t0, events.TokensGenerated{RequestID: "r1", Offset: 8, Tokens: []string{"\n", " \n\n ", "T r1 0 0 0 = - - 1"}}},
		{"large offset", "r4.12.1000000", t0, events.TokensGenerated{RequestID: "r4", Attempt: 12, Offset: 1000000, Tokens: []string{"z"}}},
		{"an earlier time", "r1.0.11", t0.Add(-3 * time.Second), events.TokensGenerated{RequestID: "r1", Offset: 11, Tokens: []string{"y"}}},
		{"a repair's id", "r1.0.12.20", t0, events.TokensGenerated{RequestID: "r1", Offset: 12, Tokens: []string{"p", "q"}}},
		{"a consolidated id", "r1.0.0.c", t0, events.TokensGenerated{RequestID: "r1", Offset: 0, Tokens: []string{"Once", " upon"}}},
		{"a dotted request id", "a.b.0.3", t0, events.TokensGenerated{RequestID: "a.b", Offset: 3, Tokens: []string{"d"}}},
		{"an id like another offset's", "r1.0.99", t0, events.TokensGenerated{RequestID: "r1", Offset: 14, Tokens: []string{"e"}}},
		{"details: json", "r1.0.15", t0, events.TokensGenerated{RequestID: "r1", Offset: 15, Tokens: []string{"x"},
			Details: []json.RawMessage{json.RawMessage(`{"finish_reason":"stop"}`)}}},
		{"prompt ids and model: json", "r5.0.0", t0, events.TokensGenerated{RequestID: "r5", Tokens: []string{"x"}, IDs: []int{9},
			PromptIDs: []int{1, 2}, Model: "m"}},
		{"a verdict: json", "r5.1.3", t0, events.TokensGenerated{RequestID: "r5", Attempt: 1, Offset: 3, Tokens: []string{"x"}, Exact: &yes}},
		{"no token: json", "r5.1.4", t0, events.TokensGenerated{RequestID: "r5", Attempt: 1, Offset: 4, Tokens: []string{}}},
		{"the monotonic clock", "r6.0.0", time.Now(), events.TokensGenerated{RequestID: "r6", Tokens: []string{"now"}}},
		{"the usual id, not given", "", t0, events.TokensGenerated{RequestID: "r7", Attempt: 2, Offset: 9, Tokens: []string{"u"}}},
		{"the usual id, not given: json", "", t0, events.TokensGenerated{RequestID: "r7", Attempt: 2, Offset: 10, Tokens: []string{"v"}, Model: "m"}},
	}
	enc, err := events.NewBatchEncoder(batchSource)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		if err := enc.AppendDelta(tt.id, tt.at, tt.ev); err != nil {
			t.Fatalf("%s: AppendDelta: %v", tt.name, err)
		}
	}
	h, body, err := enc.Message(nil, "w1.1")
	if err != nil {
		t.Fatal(err)
	}
	got := readBatch(t, h, body)
	if len(got) != len(tests) {
		t.Fatalf("got %d entries, want %d", len(got), len(tests))
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := tt.id
			if id == "" {
				id = events.ID(tt.ev.RequestID, tt.ev.Attempt, tt.ev.Offset)
			}
			want := asMessage(t, events.Envelope{ID: id, Source: batchSource, Subject: tt.ev.RequestID, Time: tt.at, Event: tt.ev})
			if !reflect.DeepEqual(got[i], want) {
				t.Errorf("entry = %#v\nwant the message's %#v", got[i], want)
			}
			if got[i].Time != want.Time { // the same instant, location and representation
				t.Errorf("time = %#v, want %#v", got[i].Time, want.Time)
			}
		})
	}
}

// TestBatchClosingEntries: an attempt's completion and failure, and a
// frontend's fence, decode as their own messages do; a delta whose subject
// is not its request is kept as JSON, as Marshal keeps it.
func TestBatchClosingEntries(t *testing.T) {
	yes := true
	entries := []events.Envelope{
		{ID: "r1.0.completed", Subject: "r1", Time: when, Event: events.RequestCompleted{RequestID: "r1", FinishReason: "stop",
			PromptTokens: 3, CompletionTokens: 16, Exact: &yes}},
		{ID: "r2.1.failed", Subject: "r2", Time: when.Add(time.Millisecond), Event: events.AttemptFailed{RequestID: "r2", Attempt: 1,
			WorkerID: "w1", Offset: 4, Reason: "upstream 503", Class: events.FailureUnavailable, Status: 503, RetryAfterMS: 1000}},
		{ID: "r3.2.fence", Subject: "r3", Time: when, Event: events.AttemptFenced{RequestID: "r3", Attempt: 2, Frontend: "fe-1"}},
		{ID: "r4.0.0", Subject: "other", Time: when, Event: events.TokensGenerated{RequestID: "r4", Tokens: []string{"a"}}},
		{ID: "r4.0.1", Subject: "r4", Time: when, Event: events.TokensGenerated{RequestID: "r4", Offset: 1, Tokens: []string{"b"}}},
	}
	enc, err := events.NewBatchEncoder(batchSource)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := enc.AppendEvent(e); err != nil {
			t.Fatalf("%s: %v", e.ID, err)
		}
	}
	h, body, err := enc.Message(nil, "w1.2")
	if err != nil {
		t.Fatal(err)
	}
	got := readBatch(t, h, body)
	if len(got) != len(entries) {
		t.Fatalf("got %d entries, want %d", len(got), len(entries))
	}
	for i, e := range entries {
		e.Source = batchSource
		if want := asMessage(t, e); !reflect.DeepEqual(got[i], want) {
			t.Errorf("%s: entry = %#v\nwant the message's %#v", e.ID, got[i], want)
		}
	}
}

// TestBatchView: the body as `nats stream view` shows it: a line of
// attributes per entry, then its text or JSON; the headers say once what is
// common.
func TestBatchView(t *testing.T) {
	enc, err := events.NewBatchEncoder(batchSource)
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(enc.AppendAttribute("ce-upstreamttftus", "812"))
	must(enc.AppendDelta("alice:r1.0.0", when, events.TokensGenerated{RequestID: "alice:r1", Tokens: []string{"Once"}, IDs: []int{7454}}))
	must(enc.AppendDelta("r2.1.40", when.Add(1200*time.Microsecond), events.TokensGenerated{RequestID: "r2", Attempt: 1, Offset: 40,
		Tokens: []string{" upon", " a"}}))
	must(enc.AppendEvent(events.Envelope{ID: "r2.1.fence", Subject: "r2", Time: when.Add(2 * time.Millisecond),
		Event: events.AttemptFenced{RequestID: "r2", Attempt: 1, Frontend: "fe-1"}}))
	h, body, err := enc.Message(nil, "w1.7")
	must(err)
	want := "X ce-upstreamttftus 3\n812\n" +
		"T alice:r1 0 0 0 = - 7454 4\nOnce\n" +
		"T r2 1 40 1200000 = 5,2 - 7\n upon a\n" +
		"J baton.request.attempt_fenced.v1 r2 2000000 r2.1.fence 49\n" +
		`{"request_id":"r2","attempt":1,"frontend":"fe-1"}` + "\n"
	if string(body) != want {
		t.Errorf("body =\n%s\nwant\n%s", body, want)
	}
	for k, v := range map[string]string{
		events.HeaderSpecVersion: "1.0", events.HeaderID: "w1.7", events.HeaderType: events.TypeTokensBatch,
		events.HeaderSource: batchSource, events.HeaderTime: "2026-03-14T15:09:26.535897932Z",
		events.HeaderContentType: events.ContentTypeBatch,
	} {
		if got := h[k]; len(got) != 1 || got[0] != v {
			t.Errorf("header %s = %q, want [%q]", k, got, v)
		}
	}
	if len(h) != 6 || !events.IsBatch(h) {
		t.Errorf("headers %v: want the six of a batch, IsBatch true", h)
	}
	got := readBatch(t, h, body)
	if v := got[0].Header["ce-upstreamttftus"]; len(v) != 1 || v[0] != "812" || len(got[0].Header) != 1 {
		t.Errorf("first entry's attributes = %v, want ce-upstreamttftus 812", got[0].Header)
	}
	if got[1].Header != nil || got[2].Header != nil {
		t.Errorf("later entries' attributes = %v, %v: want none", got[1].Header, got[2].Header)
	}
}

// TestBatchEncoderRefuses: an entry that cannot be written leaves the batch
// as it was, the attributes that waited for it included.
func TestBatchEncoderRefuses(t *testing.T) {
	tok := func(req string, attempt, offset int) events.TokensGenerated {
		return events.TokensGenerated{RequestID: req, Attempt: attempt, Offset: offset, Tokens: []string{"a"}}
	}
	tests := []struct {
		name string
		add  func(*events.BatchEncoder) error
	}{
		{"a space in the request id", func(b *events.BatchEncoder) error { return b.AppendDelta("a b.0.0", when, tok("a b", 0, 0)) }},
		{"an empty request id", func(b *events.BatchEncoder) error { return b.AppendDelta(".0.0", when, tok("", 0, 0)) }},
		{"a negative attempt", func(b *events.BatchEncoder) error { return b.AppendDelta("r.-1.0", when, tok("r", -1, 0)) }},
		{"a negative offset", func(b *events.BatchEncoder) error { return b.AppendDelta("r.0.-1", when, tok("r", 0, -1)) }},
		{"a space in the id", func(b *events.BatchEncoder) error { return b.AppendDelta("r 0", when, tok("r", 0, 0)) }},
		{"a newline in the id", func(b *events.BatchEncoder) error { return b.AppendDelta("r\n", when, tok("r", 0, 0)) }},
		{"the id marker", func(b *events.BatchEncoder) error { return b.AppendDelta("=", when, tok("r", 0, 0)) }},
		{"year 10000", func(b *events.BatchEncoder) error {
			return b.AppendDelta("r.0.0", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), tok("r", 0, 0))
		}},
		{"40 years from the batch's", func(b *events.BatchEncoder) error {
			return b.AppendDelta("r.0.0", when.AddDate(40, 0, 0), tok("r", 0, 0))
		}},
		{"ids that do not match: json, bad", func(b *events.BatchEncoder) error {
			ev := tok("r", 0, 0)
			ev.IDs = []int{1, 2}
			ev.Details = []json.RawMessage{json.RawMessage(`{`)}
			return b.AppendDelta("r.0.0", when, ev)
		}},
		{"no subject", func(b *events.BatchEncoder) error {
			return b.AppendEvent(events.Envelope{ID: "x", Time: when, Event: events.RequestCompleted{RequestID: "r"}})
		}},
		{"no event", func(b *events.BatchEncoder) error {
			return b.AppendEvent(events.Envelope{ID: "x", Subject: "r", Time: when})
		}},
		{"an unreadable", func(b *events.BatchEncoder) error {
			return b.AppendEvent(events.Envelope{ID: "x", Subject: "r", Time: when, Event: events.Unreadable{Type: "t"}})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := events.NewBatchEncoder(batchSource)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.AppendDelta("r.0.0", when, tok("r", 0, 0)); err != nil {
				t.Fatal(err)
			}
			size := b.Size()
			if err := b.AppendAttribute("ce-x", "1"); err != nil {
				t.Fatal(err)
			}
			if err := tt.add(b); err == nil {
				t.Fatal("got nil error, want the entry refused")
			}
			if b.Size() != size || b.Entries() != 1 {
				t.Errorf("after the refusal: %d bytes, %d entries; want %d, 1", b.Size(), b.Entries(), size)
			}
			h, body, err := b.Message(nil, "w1.1")
			if err != nil {
				t.Fatal(err)
			}
			if got := readBatch(t, h, body); len(got) != 1 || got[0].Header != nil {
				t.Errorf("entries %#v, want the first alone, with no attribute", got)
			}
		})
	}
	b, err := events.NewBatchEncoder(batchSource)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Message(nil, "w1.1"); err == nil {
		t.Error("an empty batch: got nil error")
	}
	if err := b.AppendAttribute("bad name", "v"); err == nil {
		t.Error("an attribute name with a space: got nil error")
	}
	if _, err := events.NewBatchEncoder("%zz"); err == nil {
		t.Error("a bad source: got nil error")
	}
}

// TestBatchDecodeErrors: a batch that is not one is refused as a whole; an
// entry that does not decode comes back as an Unreadable and the entries
// after it are read; a body that cannot be framed stops the reading there,
// for good.
func TestBatchDecodeErrors(t *testing.T) {
	enc, err := events.NewBatchEncoder(batchSource)
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.AppendDelta("r1.0.0", when, events.TokensGenerated{RequestID: "r1", Tokens: []string{"ok"}}); err != nil {
		t.Fatal(err)
	}
	h, good, err := enc.Message(nil, "w1.1")
	if err != nil {
		t.Fatal(err)
	}
	good = append([]byte(nil), good...)
	t.Run("headers", func(t *testing.T) {
		for name, tt := range map[string]struct {
			change func(events.Header)
			want   error
		}{
			"not an event": {func(h events.Header) { delete(h, events.HeaderSpecVersion) }, events.ErrNotEvent},
			"no source":    {func(h events.Header) { delete(h, events.HeaderSource) }, events.ErrNotEvent},
			"a delta":      {func(h events.Header) { h[events.HeaderType] = []string{events.TypeTokensGenerated} }, events.ErrUnknownType},
			"version 2":    {func(h events.Header) { h[events.HeaderType] = []string{"baton.tokens.batch.v2"} }, events.ErrUnknownType},
			"json":         {func(h events.Header) { h[events.HeaderContentType] = []string{"application/json"} }, events.ErrBadBatch},
			"no time":      {func(h events.Header) { delete(h, events.HeaderTime) }, events.ErrBadBatch},
		} {
			hh := events.Header{}
			for k, v := range h {
				hh[k] = v
			}
			tt.change(hh)
			if _, err := events.DecodeBatch(hh, good); !errors.Is(err, tt.want) {
				t.Errorf("%s: got %v, want %v", name, err, tt.want)
			}
		}
	})
	unreadable := []struct{ name, entry string }{
		{"unknown kind", "Q something new 3\nabc\n"},
		{"unknown type", "J baton.request.future.v1 r1 0 id1 2\n{}\n"},
		{"bad json", "J baton.request.completed.v1 r1 0 id1 1\n{\n"},
		{"invalid event", "J baton.request.completed.v1 r1 0 id1 14\n{\"attempt\":-1}\n"},
		{"the id marker in json", "J baton.request.completed.v1 r1 0 = 2\n{}\n"},
		{"delta: too few fields", "T r1 0 0 0 = - 1\na\n"},
		{"delta: negative offset", "T r1 0 -1 0 = - - 1\na\n"},
		{"delta: leading zero", "T r1 00 0 0 = - - 1\na\n"},
		{"delta: plus sign", "T r1 +1 0 0 = - - 1\na\n"},
		{"delta: minus zero time", "T r1 0 0 -0 = - - 1\na\n"},
		{"delta: 19 digits", "T r1 1000000000000000000 0 0 = - - 1\na\n"},
		{"delta: lens past the text", "T r1 0 0 0 = 1,2 - 2\nab\n"},
		{"delta: lens short of the text", "T r1 0 0 0 = 1,0 - 2\nab\n"},
		{"delta: one len", "T r1 0 0 0 = 2 - 2\nab\n"},
		{"delta: ids do not match", "T r1 0 0 0 = - 1,2 1\na\n"},
		{"delta: bad id", "T r1 0 0 0 = - x 1\na\n"},
		{"delta: a tab in the request id", "T r\t1 0 0 0 = - - 1\na\n"},
	}
	for _, tt := range unreadable {
		t.Run(tt.name, func(t *testing.T) {
			body := append([]byte("X ce-x 1\n1\n"+tt.entry), good...)
			d, err := events.DecodeBatch(h, body)
			if err != nil {
				t.Fatal(err)
			}
			e, err := d.Next()
			if err == nil || errors.Is(err, events.ErrBadBatch) || errors.Is(err, io.EOF) {
				t.Fatalf("got %v, want the entry's own error", err)
			}
			if _, ok := e.Event.(events.Unreadable); !ok {
				t.Errorf("got event %#v, want an Unreadable", e.Event)
			}
			e, err = d.Next()
			if err != nil || e.ID != "r1.0.0" || e.Header != nil {
				t.Fatalf("the entry after it: %#v, %v; want r1.0.0 with no attribute", e, err)
			}
			if _, err := d.Next(); !errors.Is(err, io.EOF) {
				t.Errorf("then: %v, want io.EOF", err)
			}
		})
	}
	t.Run("year 10000", func(t *testing.T) {
		hh := events.Header{}
		for k, v := range h {
			hh[k] = v
		}
		hh[events.HeaderTime] = []string{"9999-12-31T23:59:59.999999999Z"}
		d, err := events.DecodeBatch(hh, []byte("T r1 0 0 1 = - - 1\na\nT r1 0 1 -1 = - - 1\nb\n"))
		if err != nil {
			t.Fatal(err)
		}
		if e, err := d.Next(); err == nil || e.Event.EventType() != events.TypeTokensGenerated {
			t.Errorf("an entry past 9999: %#v, %v; want an unreadable delta", e, err)
		}
		if e, err := d.Next(); err != nil || e.Time.Year() != 9999 {
			t.Errorf("an entry before: %#v, %v; want it read", e, err)
		}
	})
	framing := []struct{ name, body string }{
		{"no newline", "T r1 0 0 0 = - - 1"},
		{"no length", "T\na\n"},
		{"length past the end", "T r1 0 0 0 = - - 5\na\n"},
		{"no newline after the payload", "T r1 0 0 0 = - - 1\nab"},
		{"a bad length", "T r1 0 0 0 = - - x\na\n"},
		{"a negative length", "T r1 0 0 0 = - - -1\na\n"},
		{"two spaces", "T r1  0 0 0 = - - 1\na\n"},
		{"a leading space", " T 1\na\n"},
		{"too many fields", "Q 1 2 3 4 5 6 7 8 9 1\na\n"},
		{"a bad attribute name", "X ce_x 1\n1\n"},
		{"an attribute with a space", "X ce-x y 1\n1\n"},
		{"an attribute at the end", "X ce-x 1\n1\n"},
		{"a blank line", "\n"},
	}
	for _, tt := range framing {
		t.Run(tt.name, func(t *testing.T) {
			body := append(append([]byte(nil), good...), tt.body...)
			d, err := events.DecodeBatch(h, body)
			if err != nil {
				t.Fatal(err)
			}
			if e, err := d.Next(); err != nil || e.ID != "r1.0.0" {
				t.Fatalf("the entry before it: %#v, %v", e, err)
			}
			_, err = d.Next()
			if !errors.Is(err, events.ErrBadBatch) {
				t.Fatalf("got %v, want ErrBadBatch", err)
			}
			if _, again := d.Next(); again == nil || again.Error() != err.Error() {
				t.Errorf("then %v, want the same error again", again)
			}
		})
	}
}

// TestBatchEncoderAllocs: once its buffer has grown, a reused encoder
// appends a delta entry, ids and several tokens included, with no
// allocation.
func TestBatchEncoderAllocs(t *testing.T) {
	enc, err := events.NewBatchEncoder(batchSource)
	if err != nil {
		t.Fatal(err)
	}
	evs := []events.TokensGenerated{
		{RequestID: "alice:r1", Attempt: 1, Offset: 1234, Tokens: []string{" word"}, IDs: []int{151643}},
		{RequestID: "alice:r1", Attempt: 1, Offset: 1235, Tokens: []string{" two", " words"}},
	}
	ids := []string{"alice:r1.1.1234", "alice:r1.1.1235.1237"}
	now := time.Now()
	fill := func() {
		enc.Reset()
		for i := range 64 {
			if err := enc.AppendDelta(ids[i%2], now, evs[i%2]); err != nil {
				t.Fatal(err)
			}
		}
	}
	fill()
	if n := testing.AllocsPerRun(100, fill); n != 0 {
		t.Errorf("%v allocations a batch of 64 entries, want 0", n)
	}
}

func TestBatchTypeNotAnEvent(t *testing.T) {
	if events.IsBatch(events.Header{events.HeaderType: {events.TypeTokensGenerated}}) {
		t.Error("IsBatch of a delta's headers: got true")
	}
	if !events.IsBatch(events.Header{events.HeaderType: {"baton.tokens.batch.v9"}}) {
		t.Error("IsBatch of a later version: got false, want true (DecodeBatch says it is unknown)")
	}
	_, err := events.Unmarshal(events.Header{events.HeaderSpecVersion: {"1.0"}, events.HeaderID: {"b"},
		events.HeaderType: {events.TypeTokensBatch}, events.HeaderSource: {batchSource}}, nil)
	if !errors.Is(err, events.ErrUnknownType) {
		t.Errorf("Unmarshal of a batch: %v, want ErrUnknownType (an old reader skips it knowingly)", err)
	}
}
