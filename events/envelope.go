package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
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
// the event as JSON data. The attributes are validated against the
// CloudEvents 1.0 specification, and the time must be representable in
// RFC 3339 (years 0 to 9999), so that whatever Marshal writes Unmarshal reads.
func Marshal(e Envelope) (Header, []byte, error) {
	if e.Event == nil {
		return nil, nil, fmt.Errorf("events: marshal: nil event")
	}
	ts, err := attributes(e, e.Event.EventType())
	if err != nil {
		return nil, nil, fmt.Errorf("events: marshal %s: %w", e.Event.EventType(), err)
	}
	data, err := json.Marshal(e.Event)
	if err != nil {
		return nil, nil, fmt.Errorf("events: marshal %s: %w", e.Event.EventType(), err)
	}
	h := Header{
		HeaderSpecVersion: {cloudevent.CloudEventsVersionV1},
		HeaderID:          {e.ID},
		HeaderType:        {e.Event.EventType()},
		HeaderSource:      {e.Source},
		HeaderTime:        {ts},
		HeaderContentType: {contentTypeJSON},
		HeaderMsgID:       {e.ID},
	}
	if e.Subject != "" {
		h[HeaderSubject] = []string{e.Subject}
	}
	return h, data, nil
}

// attributes validates the CloudEvents attributes of e with type typ and
// returns the ce-time header value. Marshal and Unmarshal share it, so a
// decoded envelope always encodes again.
func attributes(e Envelope, typ string) (string, error) {
	ce := cloudevent.New(cloudevent.CloudEventsVersionV1)
	ce.SetID(e.ID)
	ce.SetType(typ)
	ce.SetSource(e.Source)
	if e.Subject != "" {
		ce.SetSubject(e.Subject)
	}
	ce.SetTime(e.Time)
	ce.SetDataContentType(contentTypeJSON)
	if err := ce.Validate(); err != nil {
		return "", err
	}
	ts, err := e.Time.UTC().MarshalText() // RFC 3339 with nanoseconds; fails outside years 0-9999
	if err != nil {
		return "", fmt.Errorf("time: %w", err)
	}
	return string(ts), nil
}

// Unmarshal decodes a message written by Marshal. It returns ErrNotEvent for a
// message without CloudEvents attributes and ErrUnknownType (with the envelope's
// attributes filled in) for a type this build does not know; callers skip both.
func Unmarshal(h Header, data []byte) (Envelope, error) {
	get := func(k string) string {
		if v := h[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
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
	if _, err := attributes(e, typ); err != nil {
		return Envelope{}, fmt.Errorf("%w: %w", ErrNotEvent, err)
	}
	newEvent, ok := registry[typ]
	if !ok {
		return e, fmt.Errorf("%w: %s", ErrUnknownType, typ)
	}
	ev, err := newEvent(data)
	if err != nil {
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
