package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Header names of the binary content mode of the CloudEvents NATS binding, and
// the JetStream deduplication header that carries the same id.
const (
	HeaderSpecVersion = "ce-specversion"
	HeaderID          = "ce-id"
	HeaderType        = "ce-type"
	HeaderSource      = "ce-source"
	HeaderSubject     = "ce-subject"
	HeaderTime        = "ce-time"
	HeaderContentType = "Content-Type"
	HeaderMsgID       = "Nats-Msg-Id"

	contentTypeJSON = "application/json"
	specVersion     = "1.0"
)

// Sentinel errors of the package.
var (
	// ErrUnknownType marks a message whose ce-type this build does not know.
	// Readers skip such messages.
	ErrUnknownType = errors.New("events: unknown event type")
	// ErrNotEvent marks a message without CloudEvents attributes.
	ErrNotEvent = errors.New("events: not a cloudevent")
)

// Event is one fact. Implementations are plain value structs that marshal to JSON.
type Event interface {
	// EventType is the CloudEvents type, e.g. "baton.request.routed.v1".
	EventType() string
}

// Envelope is an event with its CloudEvents context and, once stored, its
// JetStream position.
type Envelope struct {
	ID      string    // CloudEvents id, also Nats-Msg-Id
	Source  string    // producer, e.g. "baton/frontend/fe-1"
	Subject string    // what the event is about: a request or worker id
	Time    time.Time // when it happened, set by the producer
	Event   Event

	// Stream position, set by the reader; zero for an envelope not yet stored.
	Seq     uint64 // stream sequence
	LastSeq uint64 // previous sequence of the same NATS subject (RePublish), if known
	Stored  string // the NATS subject it is stored on (not the republished one), if known
	// Header holds the message's headers as the reader got them, extension
	// attributes this package does not read included; nil for an envelope
	// not read from a message. Read-only, and not to be kept.
	Header Header
}

// Type returns the CloudEvents type of the carried event.
func (e Envelope) Type() string {
	if e.Event == nil {
		return ""
	}
	return e.Event.EventType()
}

// Header is the shape of NATS message headers (nats.Header is the same map type).
type Header = map[string][]string

// Marshal encodes e in CloudEvents binary content mode: attributes as headers,
// the event as JSON data (a token delta that carries only text has its text
// as data: see DeltaEncoder). The attributes are validated against the
// CloudEvents 1.0 specification, and the time must be representable in
// RFC 3339 (years 0 to 9999), so that whatever Marshal writes Unmarshal reads.
func Marshal(e Envelope) (Header, []byte, error) {
	if e.Event == nil {
		return nil, nil, fmt.Errorf("events: marshal: nil event")
	}
	typ := e.Event.EventType()
	if _, ok := e.Event.(Unreadable); ok {
		return nil, nil, fmt.Errorf("events: marshal %s: an unreadable event is never written", typ)
	}
	if err := validate(e.ID, typ, e.Source); err != nil {
		return nil, nil, fmt.Errorf("events: marshal %s: %w", typ, err)
	}
	if ev, ok := e.Event.(TokensGenerated); ok && e.Subject == ev.RequestID && ev.Attempt >= 0 {
		if enc, err := NewDeltaEncoder(e.Source, ev.RequestID, ev.Attempt); err == nil {
			return enc.Encode(e.ID, e.Time, ev)
		}
	}
	ts, err := e.Time.UTC().MarshalText() // RFC 3339 with nanoseconds; fails outside years 0-9999
	if err != nil {
		return nil, nil, fmt.Errorf("events: marshal %s: time: %w", typ, err)
	}
	data, err := jsonMarshal(e.Event)
	if err != nil {
		return nil, nil, fmt.Errorf("events: marshal %s: %w", typ, err)
	}
	h := Header{
		HeaderSpecVersion: specVersionValue,
		HeaderID:          {e.ID},
		HeaderType:        {typ},
		HeaderSource:      {e.Source},
		HeaderTime:        {string(ts)},
		HeaderContentType: jsonValue,
		HeaderMsgID:       {e.ID},
	}
	if e.Subject != "" {
		h[HeaderSubject] = []string{e.Subject}
	}
	return h, data, nil
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// validate checks the required CloudEvents 1.0 attributes as the CloudEvents
// SDK does (EventContextV1.Validate after SetID, SetType, SetSource), without
// building its objects: id and type are not blank, source is a non-blank
// URI-reference. An optional subject that is blank is dropped by the SDK,
// so it is valid. FuzzValidate holds the two to the same answers.
func validate(id, typ, source string) error {
	if strings.TrimSpace(id) == "" {
		return errors.New("id: MUST be a non-empty string")
	}
	if strings.TrimSpace(typ) == "" {
		return errors.New("type: MUST be a non-empty string")
	}
	if plainPath(source) {
		return nil // what url.Parse would accept, without its allocations (every delta has a source)
	}
	u, err := url.Parse(source)
	if err != nil || strings.TrimSpace(u.String()) == "" {
		return errors.New("source: REQUIRED, a non-empty URI-reference")
	}
	return nil
}

// plainPath reports whether s is a relative URI reference that needs no
// parsing to be known valid: a letter or digit, then only unreserved
// characters and slashes (no scheme, authority, query, fragment or escape),
// as baton's own sources are ("baton/worker/w1").
func plainPath(s string) bool {
	if s == "" || !isAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '-' && c != '.' && c != '_' && c != '~' && c != '/' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// headerValue is h's first value of k, or "" (a Header is a plain map, as
// NATS's is, so it has no Get of its own).
func headerValue(h Header, k string) string {
	if v := h[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Unmarshal decodes a message written by Marshal. It returns ErrNotEvent for a
// message without CloudEvents attributes. For a type this build does not know
// it returns ErrUnknownType, and for data that does not decode as its type a
// decode error; in both cases the envelope's attributes are filled in and
// its Event is an Unreadable that says why, so that a reader can skip the
// event knowingly. Unknown fields of a known type are ignored.
func Unmarshal(h Header, data []byte) (Envelope, error) {
	get := func(k string) string { return headerValue(h, k) }
	if get(HeaderSpecVersion) == "" {
		return Envelope{}, ErrNotEvent
	}
	e := Envelope{ID: get(HeaderID), Source: get(HeaderSource), Subject: get(HeaderSubject)}
	typ := get(HeaderType)
	if e.ID == "" || typ == "" || e.Source == "" {
		return Envelope{}, fmt.Errorf("%w: missing id, type or source", ErrNotEvent)
	}
	if ts := get(HeaderTime); ts != "" {
		t, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			return Envelope{}, fmt.Errorf("events: bad %s %q: %w", HeaderTime, ts, err)
		}
		e.Time = t
	}
	if err := validate(e.ID, typ, e.Source); err != nil {
		return Envelope{}, fmt.Errorf("%w: %w", ErrNotEvent, err)
	}
	if y := e.Time.UTC().Year(); y < 0 || y > 9999 { // what Marshal could not write
		return Envelope{}, fmt.Errorf("%w: time %v outside RFC 3339", ErrNotEvent, e.Time)
	}
	if typ == TypeTokensGenerated && isText(get(HeaderContentType)) {
		ev, err := decodeDelta(e, get, data)
		if err == nil {
			err = ev.validate()
		}
		if err != nil {
			e.Event = Unreadable{Type: typ, Reason: "data does not decode: " + err.Error()}
			return e, fmt.Errorf("events: decode %s %s: %w", typ, e.ID, err)
		}
		e.Event = ev
		return e, nil
	}
	return decodeJSON(e, typ, data)
}

// decodeJSON sets e's event to data, the JSON of an event of type typ, as
// Unmarshal does: an Unreadable that says why, and the error, for a type
// this build does not know or data that does not decode.
func decodeJSON(e Envelope, typ string, data []byte) (Envelope, error) {
	newEvent, ok := registry[typ]
	if !ok {
		e.Event = Unreadable{Type: typ, Reason: unknownReason(typ)}
		return e, fmt.Errorf("%w: %s", ErrUnknownType, typ)
	}
	ev, err := newEvent(data)
	if err != nil {
		e.Event = Unreadable{Type: typ, Reason: "data does not decode: " + err.Error()}
		return e, fmt.Errorf("events: decode %s %s: %w", typ, e.ID, err)
	}
	e.Event = ev
	return e, nil
}

// registry maps a CloudEvents type to a decoder of its JSON data.
var registry = map[string]func([]byte) (Event, error){}

// register adds T to the registry under its type name.
func register[T Event]() {
	var zero T
	registry[zero.EventType()] = func(data []byte) (Event, error) {
		var v T
		if err := json.Unmarshal(data, &v); err != nil {
			return nil, err
		}
		if val, ok := any(&v).(interface{ validate() error }); ok {
			if err := val.validate(); err != nil {
				return nil, err
			}
		}
		return v, nil
	}
}

// Types lists every event type this build decodes.
func Types() []string {
	out := make([]string, 0, len(registry))
	for t := range registry {
		out = append(out, t)
	}
	return out
}

// ID builds a deterministic event id from parts, so that a retried append of
// the same fact carries the same Nats-Msg-Id and is deduplicated.
func ID(parts ...any) string {
	b := make([]byte, 0, 64)
	for i, p := range parts {
		if i > 0 {
			b = append(b, '.')
		}
		switch v := p.(type) {
		case string:
			b = append(b, v...)
		case int:
			b = strconv.AppendInt(b, int64(v), 10)
		case uint64:
			b = strconv.AppendUint(b, v, 10)
		default:
			b = fmt.Append(b, v)
		}
	}
	return string(b)
}
