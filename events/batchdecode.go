package events

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"
)

// IsBatch reports whether a message's headers are those of a batch of any
// version (its entries are read with DecodeBatch).
func IsBatch(h Header) bool {
	v := h[HeaderType]
	return len(v) > 0 && len(v[0]) > len(batchBase) && v[0][:len(batchBase)] == batchBase
}

const batchBase = "baton.tokens.batch.v"

// BatchDecoder reads the entries of one batch in order (DecodeBatch). It
// reads data in place, so data must not change while it is read; what it
// returns shares none of it. It is not safe for concurrent use.
type BatchDecoder struct {
	source  string
	base    time.Time
	rest    []byte // the entries not read yet
	n       int    // entries read
	err     error  // the framing error that stopped it
	attrs   Header // attributes of the next entry
	scratch []byte
}

// DecodeBatch checks the headers of a batch message and returns the reader
// of its entries. It returns ErrNotEvent for a message without CloudEvents
// attributes, ErrUnknownType for a type other than TypeTokensBatch (a
// batch of another version among them), and ErrBadBatch for a batch
// without its Content-Type or time.
func DecodeBatch(h Header, data []byte) (BatchDecoder, error) {
	get := func(k string) string { return headerValue(h, k) }
	if get(HeaderSpecVersion) == "" {
		return BatchDecoder{}, ErrNotEvent
	}
	id, typ, source := get(HeaderID), get(HeaderType), get(HeaderSource)
	if err := validate(id, typ, source); err != nil {
		return BatchDecoder{}, fmt.Errorf("%w: %w", ErrNotEvent, err)
	}
	if typ != TypeTokensBatch {
		return BatchDecoder{}, fmt.Errorf("%w: %s is not a batch this build reads", ErrUnknownType, typ)
	}
	if ct := get(HeaderContentType); ct != ContentTypeBatch {
		return BatchDecoder{}, fmt.Errorf("%w %s: Content-Type %q", ErrBadBatch, id, ct)
	}
	base, err := time.Parse(time.RFC3339Nano, get(HeaderTime))
	if err != nil {
		return BatchDecoder{}, fmt.Errorf("%w %s: %s: %w", ErrBadBatch, id, HeaderTime, err)
	}
	return BatchDecoder{source: source, base: base, rest: data}, nil
}

// Next returns the next entry as the envelope its own message would decode
// to (Unmarshal's: no stream position, and Header only its extension
// attributes, nil when it has none), or io.EOF after the last. An entry it
// cannot read (an unknown kind or type, data that does not decode) comes
// back as Unmarshal gives such an event, an Unreadable with the error that
// says why, and the entries after it are read on. A body it cannot frame
// stops it: that call and every later one return the same ErrBadBatch.
func (d *BatchDecoder) Next() (Envelope, error) {
	for {
		if d.err != nil {
			return Envelope{}, d.err
		}
		if len(d.rest) == 0 {
			if d.attrs != nil {
				d.err = fmt.Errorf("%w: attributes after the last entry", ErrBadBatch)
				continue
			}
			return Envelope{}, io.EOF
		}
		f, nf, payload, err := d.cut()
		if err != nil {
			d.err = fmt.Errorf("%w: entry %d: %w", ErrBadBatch, d.n, err)
			continue
		}
		switch string(f[0]) {
		case entryAttr:
			if nf != 2 || !attrName(string(f[1])) {
				d.err = fmt.Errorf("%w: entry %d: bad attribute %q", ErrBadBatch, d.n, clip(f[1]))
				continue
			}
			if d.attrs == nil {
				d.attrs = Header{}
			}
			d.attrs[string(f[1])] = append(d.attrs[string(f[1])], string(payload))
			continue
		case entryTokens:
			d.n++
			return d.delta(f, nf, payload)
		case entryJSON:
			d.n++
			return d.json(f, nf, payload)
		}
		d.n++
		d.attrs = nil
		kind := string(clip(f[0]))
		return Envelope{Source: d.source, Event: Unreadable{Type: kind, Reason: "unknown batch entry kind (written by a newer build?)"}},
			fmt.Errorf("%w: batch entry kind %q", ErrUnknownType, kind)
	}
}

// maxFields is the most fields an entry's line has, its length not counted.
const maxFields = 8

// cut takes the next entry off the body: the fields of its line before the
// length, and its payload.
func (d *BatchDecoder) cut() (f [maxFields][]byte, nf int, payload []byte, err error) {
	i := bytes.IndexByte(d.rest, '\n')
	if i < 0 {
		return f, 0, nil, errors.New("a line with no end")
	}
	line := d.rest[:i]
	j := bytes.LastIndexByte(line, ' ')
	if j < 0 {
		return f, 0, nil, fmt.Errorf("line %q has no length", clip(line))
	}
	n, ok := parseNum(line[j+1:], false)
	if !ok || n > int64(len(d.rest)-i-2) || d.rest[i+1+int(n)] != '\n' {
		return f, 0, nil, fmt.Errorf("line %q: bad length for the %d bytes left", clip(line), len(d.rest)-i-1)
	}
	payload, d.rest = d.rest[i+1:i+1+int(n)], d.rest[i+2+int(n):]
	for rest := line[:j]; ; {
		k := bytes.IndexByte(rest, ' ')
		if k < 0 {
			k = len(rest)
		}
		if k == 0 || nf == maxFields {
			return f, 0, nil, fmt.Errorf("line %q: an empty field, or too many", clip(line))
		}
		f[nf], nf = rest[:k], nf+1
		if k == len(rest) {
			return f, nf, payload, nil
		}
		rest = rest[k+1:]
	}
}

// delta reads a T entry.
func (d *BatchDecoder) delta(f [maxFields][]byte, nf int, text []byte) (Envelope, error) {
	e := Envelope{Source: d.source}
	if nf != 8 || !fieldBytes(f[1]) || !fieldBytes(f[5]) {
		return d.unreadable(e, TypeTokensGenerated, errors.New("bad fields of a delta"))
	}
	attempt, okA := parseNum(f[2], false)
	offset, okO := parseNum(f[3], false)
	dt, okT := parseNum(f[4], true)
	if !okA || !okO || !okT {
		return d.unreadable(e, TypeTokensGenerated, fmt.Errorf("bad attempt %q, offset %q or time %q", clip(f[2]), clip(f[3]), clip(f[4])))
	}
	// One string holds the text, the request id and the event id: the
	// entry's one copy, shared by the event's strings.
	s := append(d.scratch[:0], text...)
	s = append(s, f[1]...)
	derivedAt := -1
	if string(f[5]) == derivedID {
		derivedAt = len(text)
		s = append(s, '.')
		s = append(s, f[2]...)
		s = append(s, '.')
		s = append(s, f[3]...)
	} else {
		s = append(s, f[5]...)
	}
	d.scratch = s
	str := string(s)
	req := str[len(text) : len(text)+len(f[1])]
	e.ID, e.Subject = str[len(text)+len(f[1]):], req
	if derivedAt >= 0 {
		e.ID = str[derivedAt:]
	}
	var err error
	if e.Time, err = d.at(dt); err != nil {
		return d.unreadable(e, TypeTokensGenerated, err)
	}
	ev := TokensGenerated{RequestID: req, Attempt: int(attempt), Offset: int(offset)}
	if ev.Tokens, err = cutTokens(f[6], str[:len(text)]); err != nil {
		return d.unreadable(e, TypeTokensGenerated, err)
	}
	if string(f[7]) != noField {
		if ev.IDs, err = parseNums(f[7]); err != nil || len(ev.IDs) != len(ev.Tokens) {
			return d.unreadable(e, TypeTokensGenerated, fmt.Errorf("bad ids %q for %d tokens", clip(f[7]), len(ev.Tokens)))
		}
	}
	e.Event, e.Header = ev, d.takeAttrs()
	return e, nil
}

// json reads a J entry.
func (d *BatchDecoder) json(f [maxFields][]byte, nf int, data []byte) (Envelope, error) {
	e := Envelope{Source: d.source}
	if nf != 5 || !fieldBytes(f[1]) || !fieldBytes(f[2]) || !fieldBytes(f[4]) || string(f[4]) == derivedID {
		return d.unreadable(e, "", errors.New("bad fields of an event"))
	}
	s := string(append(append(d.scratch[:0], f[2]...), f[4]...))
	e.Subject, e.ID = s[:len(f[2])], s[len(f[2]):]
	typ := string(f[1])
	dt, ok := parseNum(f[3], true)
	if !ok {
		return d.unreadable(e, typ, fmt.Errorf("bad time %q", clip(f[3])))
	}
	var err error
	if e.Time, err = d.at(dt); err != nil {
		return d.unreadable(e, typ, err)
	}
	e.Header = d.takeAttrs()
	return decodeJSON(e, typ, data)
}

// unreadable returns e as an entry this build cannot read, for why.
func (d *BatchDecoder) unreadable(e Envelope, typ string, why error) (Envelope, error) {
	e.Event, e.Header = Unreadable{Type: typ, Reason: "data does not decode: " + why.Error()}, d.takeAttrs()
	return e, fmt.Errorf("events: decode batch entry %d %s %s: %w", d.n-1, typ, e.ID, why)
}

// takeAttrs hands the attributes read to the entry they came before.
func (d *BatchDecoder) takeAttrs() Header {
	h := d.attrs
	d.attrs = nil
	return h
}

// at is the time of an entry dt nanoseconds after the batch's, which must
// be one a message's ce-time can say.
func (d *BatchDecoder) at(dt int64) (time.Time, error) {
	t := d.base.Add(time.Duration(dt))
	if y := t.UTC().Year(); y < 0 || y > 9999 {
		return time.Time{}, fmt.Errorf("time %d ns after %v outside RFC 3339", dt, d.base)
	}
	return t, nil
}

// cutTokens cuts text into tokens of the byte lengths lens ("-": one token).
func cutTokens(lens []byte, text string) ([]string, error) {
	if string(lens) == noField {
		return []string{text}, nil
	}
	out := make([]string, 0, bytes.Count(lens, []byte{','})+1)
	at := 0
	for f := range bytes.SplitSeq(lens, []byte{','}) {
		n, ok := parseNum(f, false)
		if !ok || n > int64(len(text)-at) {
			return nil, fmt.Errorf("bad lens %q for %d bytes of text", clip(lens), len(text))
		}
		out = append(out, text[at:at+int(n)])
		at += int(n)
	}
	if len(out) < 2 || at != len(text) {
		return nil, fmt.Errorf("bad lens %q for %d bytes of text", clip(lens), len(text))
	}
	return out, nil
}

// parseNums reads a comma-separated list of integers.
func parseNums(b []byte) ([]int, error) {
	out := make([]int, 0, bytes.Count(b, []byte{','})+1)
	for f := range bytes.SplitSeq(b, []byte{','}) {
		v, ok := parseNum(f, true)
		if !ok {
			return nil, fmt.Errorf("bad number %q", clip(f))
		}
		out = append(out, int(v))
	}
	return out, nil
}

// parseNum reads a decimal integer in its one encoding: no '+', no leading
// zero, no "-0", at most 18 digits (so that it cannot overflow); negative
// only if signed.
func parseNum(b []byte, signed bool) (int64, bool) {
	neg := signed && len(b) > 1 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 18 || (b[0] == '0' && (len(b) > 1 || neg)) {
		return 0, false
	}
	var v int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = 10*v + int64(c-'0')
	}
	if neg {
		v = -v
	}
	return v, true
}

// clip is the start of b, for an error message.
func clip(b []byte) []byte { return b[:min(len(b), 80)] }

func fieldBytes(b []byte) bool {
	for _, c := range b {
		if c <= ' ' || c == 0x7f {
			return false
		}
	}
	return len(b) > 0
}
