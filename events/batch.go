package events

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// A batch is one message that carries the entries of many attempts: the
// deltas a worker coalesced over a window, and the rare entries that close
// an attempt (its completion or failure, a frontend's fence). Issue 33's
// design (docs/internals.md, "The write path of many tokens per message")
// builds on it. Its headers are the CloudEvents attributes of the batch
// itself, said once: type TypeTokensBatch, the producer as source, the time
// of its first entry, Content-Type ContentTypeBatch. Its body is a sequence
// of entries with no headers of their own, each
//
//	<kind> <field> ... <length>\n<payload of length bytes>\n
//
// one line of space-separated fields whose last is the length of the
// payload that follows it, so that a reader can step over a kind it does not
// know, and so that `nats stream view` shows one line of attributes and
// then the text. The kinds:
//
//	T <request> <attempt> <offset> <time> <id> <lens> <ids> <length>   a delta: the payload is its text
//	J <type> <subject> <time> <id> <length>                            any other event: the payload is its JSON
//	X <name> <length>                                                  an extension attribute of the next entry: the payload is its value
//
// <time> is the entry's time in nanoseconds after the batch's ce-time. <id>
// is the entry's event id, "=" in a delta for "<request>.<attempt>.<offset>"
// (the id of a worker's first try of a delta, events.ID's). <lens> is "-"
// for a single token, else the byte lengths of the tokens, comma-separated;
// <ids> is "-" when the engine gave no token ids, else one per token.
// Numbers are decimal, without a sign unless negative and without leading
// zeros, so each entry has one encoding. Fields are never empty and hold no
// byte at or below the space, nor DEL. A delta that carries more than text
// and ids (details, prompt ids, a model, a verdict) is a J entry, as Marshal
// writes it as JSON.
const (
	// TypeTokensBatch is the ce-type of a batch.
	TypeTokensBatch = "baton.tokens.batch.v1"
	// ContentTypeBatch is the Content-Type of a batch's body.
	ContentTypeBatch = "text/vnd.baton.batch.v1"
)

// ErrBadBatch marks a batch whose body is not a sequence of entries: its
// decoder returns it, and nothing more, from the entry it cannot frame on.
var ErrBadBatch = errors.New("events: bad batch")

// Batch entry kinds and field markers.
const (
	entryTokens = "T"
	entryJSON   = "J"
	entryAttr   = "X"
	derivedID   = "=" // a delta's id is "<request>.<attempt>.<offset>"
	noField     = "-" // one token (lens); no token ids (ids)
)

var (
	batchTypeValue = []string{TypeTokensBatch}
	batchCTValue   = []string{ContentTypeBatch}
)

// BatchEncoder appends entries to one batch at a time, in a buffer it
// reuses: once the buffer has grown to a batch's size, a delta entry costs
// no allocation. It is not safe for concurrent use. Every Append either
// appends its entry whole or leaves the batch as it was and returns an
// error; the entries of a batch are read back in the order they were
// appended.
type BatchEncoder struct {
	sourceV []string
	buf     []byte
	base    time.Time // the first entry's time, on the wall clock, UTC
	entries int
	// attrs is where the attributes waiting for their entry begin in buf,
	// or -1: an entry that fails takes them back with it.
	attrs int
}

// NewBatchEncoder returns the encoder of the batches of source (the
// producer, e.g. "baton/worker/w1"): the source of every entry in them.
func NewBatchEncoder(source string) (*BatchEncoder, error) {
	if err := validate("x", TypeTokensBatch, source); err != nil {
		return nil, fmt.Errorf("events: batch encoder: %w", err)
	}
	return &BatchEncoder{sourceV: []string{source}, attrs: -1}, nil
}

// Reset empties the batch, keeping its buffer.
func (b *BatchEncoder) Reset() {
	b.buf, b.entries, b.attrs, b.base = b.buf[:0], 0, -1, time.Time{}
}

// Entries is how many entries the batch holds (attributes not counted).
func (b *BatchEncoder) Entries() int { return b.entries }

// Size is the length of the batch's body so far, in bytes.
func (b *BatchEncoder) Size() int { return len(b.buf) }

// AppendAttribute gives the next entry appended an extension attribute: a
// header its event would carry as a message of its own, such as a first
// delta's ce-upstreamttftus. The decoder hands it back as the entry's
// Envelope.Header. name is 1 to 64 letters, digits and '-'.
func (b *BatchEncoder) AppendAttribute(name, value string) error {
	if !attrName(name) {
		return fmt.Errorf("events: batch attribute: bad name %q", name)
	}
	if b.attrs < 0 {
		b.attrs = len(b.buf)
	}
	b.buf = append(b.buf, entryAttr...)
	b.buf = append(b.buf, ' ')
	b.buf = append(b.buf, name...)
	b.buf = b.endLine(value)
	return nil
}

// AppendDelta appends ev, a delta stored under event id at t, as the entry
// that decodes to what Unmarshal decodes its own message to
// (DeltaEncoder's): a T entry when it carries only text and token ids, else
// its JSON. An empty id is the delta's usual one, events.ID(request,
// attempt, offset), which the entry then does not spell out (nor does the
// caller format it).
func (b *BatchEncoder) AppendDelta(id string, t time.Time, ev TokensGenerated) error {
	if !field(ev.RequestID) || ev.Attempt < 0 || ev.Offset < 0 {
		return b.fail(fmt.Errorf("events: batch delta: bad request id %q, attempt %d or offset %d", ev.RequestID, ev.Attempt, ev.Offset))
	}
	if !binaryDelta(ev) {
		if id == "" {
			id = ID(ev.RequestID, ev.Attempt, ev.Offset)
		}
		return b.appendJSON(TypeTokensGenerated, ev.RequestID, id, t, ev)
	}
	if id != "" && (!field(id) || id == derivedID) {
		return b.fail(fmt.Errorf("events: batch delta: bad id %q", id))
	}
	dt, err := b.at(t)
	if err != nil {
		return b.fail(err)
	}
	buf := append(b.buf, entryTokens...)
	buf = append(buf, ' ')
	buf = append(buf, ev.RequestID...)
	buf = append(buf, ' ')
	buf = strconv.AppendInt(buf, int64(ev.Attempt), 10)
	buf = append(buf, ' ')
	buf = strconv.AppendInt(buf, int64(ev.Offset), 10)
	buf = append(buf, ' ')
	buf = strconv.AppendInt(buf, dt, 10)
	buf = append(buf, ' ')
	if id == "" || derived(id, ev) {
		buf = append(buf, derivedID...)
	} else {
		buf = append(buf, id...)
	}
	buf = append(buf, ' ')
	n := 0
	for i, tok := range ev.Tokens {
		if len(ev.Tokens) > 1 {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = strconv.AppendInt(buf, int64(len(tok)), 10)
		}
		n += len(tok)
	}
	if len(ev.Tokens) == 1 {
		buf = append(buf, noField...)
	}
	buf = append(buf, ' ')
	if ev.IDs == nil {
		buf = append(buf, noField...)
	}
	for i, v := range ev.IDs {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = strconv.AppendInt(buf, int64(v), 10)
	}
	buf = append(buf, ' ')
	buf = strconv.AppendInt(buf, int64(n), 10)
	buf = append(buf, '\n')
	for _, tok := range ev.Tokens {
		buf = append(buf, tok...)
	}
	b.buf = append(buf, '\n')
	b.done()
	return nil
}

// AppendEvent appends e, a request event (e.Subject its request), as the
// entry that decodes to what Unmarshal decodes e's own message to: a delta
// as AppendDelta does, any other event as its JSON. The entry's source is
// the batch's; e.Source and e.Header are not written (extension
// attributes go through AppendAttribute).
func (b *BatchEncoder) AppendEvent(e Envelope) error {
	if e.Event == nil {
		return b.fail(errors.New("events: batch entry: nil event"))
	}
	if _, ok := e.Event.(Unreadable); ok {
		return b.fail(fmt.Errorf("events: batch entry %s: an unreadable event is never written", e.Event.EventType()))
	}
	if ev, ok := e.Event.(TokensGenerated); ok && e.Subject == ev.RequestID {
		return b.AppendDelta(e.ID, e.Time, ev)
	}
	return b.appendJSON(e.Event.EventType(), e.Subject, e.ID, e.Time, e.Event)
}

func (b *BatchEncoder) appendJSON(typ, subject, id string, t time.Time, ev Event) error {
	if !field(typ) || !field(subject) || !field(id) || id == derivedID {
		return b.fail(fmt.Errorf("events: batch entry: bad type %q, subject %q or id %q", typ, subject, id))
	}
	dt, err := b.at(t)
	if err != nil {
		return b.fail(err)
	}
	data, err := jsonMarshal(ev)
	if err != nil {
		return b.fail(fmt.Errorf("events: batch entry %s: %w", typ, err))
	}
	buf := append(b.buf, entryJSON...)
	for _, f := range [...]string{typ, subject} {
		buf = append(buf, ' ')
		buf = append(buf, f...)
	}
	buf = append(buf, ' ')
	buf = strconv.AppendInt(buf, dt, 10)
	buf = append(buf, ' ')
	buf = append(buf, id...)
	b.buf = buf
	b.buf = b.endLine(string(data))
	b.done()
	return nil
}

// endLine ends an entry's line with the length of payload, and appends
// payload.
func (b *BatchEncoder) endLine(payload string) []byte {
	buf := append(b.buf, ' ')
	buf = strconv.AppendInt(buf, int64(len(payload)), 10)
	buf = append(buf, '\n')
	buf = append(buf, payload...)
	return append(buf, '\n')
}

// at returns t's offset from the batch's time, the first entry's: t itself
// for that one.
func (b *BatchEncoder) at(t time.Time) (int64, error) {
	t = t.Round(0).UTC() // the wall clock, as a message's ce-time says
	if y := t.Year(); y < 0 || y > 9999 {
		return 0, fmt.Errorf("events: batch entry: time: year %d outside of range [0,9999]", y)
	}
	if b.entries == 0 {
		b.base = t
	}
	dt := t.Sub(b.base) // saturates: checked below
	if !b.base.Add(dt).Equal(t) || dt <= -maxOffset || dt >= maxOffset {
		return 0, fmt.Errorf("events: batch entry: time %v too far from the batch's %v", t, b.base)
	}
	return int64(dt), nil
}

// maxOffset bounds an entry's time offset: 18 digits of nanoseconds (31
// years), what the decoder reads without overflow.
const maxOffset = 1e18

// done counts an entry appended: the attributes before it are its own.
func (b *BatchEncoder) done() { b.entries, b.attrs = b.entries+1, -1 }

// fail takes back the attributes that waited for the entry that failed.
func (b *BatchEncoder) fail(err error) error {
	if b.attrs >= 0 {
		b.buf, b.attrs = b.buf[:b.attrs], -1
	}
	return err
}

// Message returns the batch as a message under event id: its headers,
// written into h (cleared first; nil: a new map), and its body, the
// encoder's buffer, valid until the next Append or Reset. It has no
// Nats-Msg-Id: a caller that retries the batch adds one.
func (b *BatchEncoder) Message(h Header, id string) (Header, []byte, error) {
	if err := validate(id, TypeTokensBatch, b.sourceV[0]); err != nil {
		return nil, nil, fmt.Errorf("events: batch: %w", err)
	}
	if b.entries == 0 || b.attrs >= 0 {
		return nil, nil, fmt.Errorf("events: batch: %d entries, attributes with no entry: %v", b.entries, b.attrs >= 0)
	}
	var tsBuf [len(time.RFC3339Nano)]byte
	v := [2]string{id, string(b.base.AppendFormat(tsBuf[:0], time.RFC3339Nano))}
	if h == nil {
		h = make(Header, 6)
	} else {
		clear(h)
	}
	h[HeaderSpecVersion] = specVersionValue
	h[HeaderID] = v[0:1:1]
	h[HeaderType] = batchTypeValue
	h[HeaderSource] = b.sourceV
	h[HeaderTime] = v[1:2:2]
	h[HeaderContentType] = batchCTValue
	return h, b.buf, nil
}

// derived reports whether id is "<request>.<attempt>.<offset>" of ev.
func derived(id string, ev TokensGenerated) bool {
	r := ev.RequestID
	if len(id) <= len(r)+1 || id[:len(r)] != r || id[len(r)] != '.' {
		return false
	}
	var nb [41]byte
	x := strconv.AppendInt(nb[:0], int64(ev.Attempt), 10)
	x = append(x, '.')
	x = strconv.AppendInt(x, int64(ev.Offset), 10)
	return id[len(r)+1:] == string(x)
}

// field reports whether s can be a field of an entry's line.
func field(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] == 0x7f {
			return false
		}
	}
	return true
}

// attrName reports whether s can name an extension attribute.
func attrName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '-' {
			return false
		}
	}
	return true
}
