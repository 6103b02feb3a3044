package events

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A token delta (TokensGenerated) is the hot path: one message per token at
// decode rates. When it carries only text (and token ids), it is written in
// CloudEvents binary content mode with its text as the data (Content-Type
// ContentTypeText) and its attempt, offset, token lengths and ids in the
// extension attributes below, so `nats stream view` shows the text itself.
// A delta that carries more (an entry of Details, the prompt's ids, no token
// at all) or whose ce-subject is not its request id keeps the JSON data of
// every other event type. Readers accept both, and deltas stored before the
// binary form existed are JSON. docs/internals.md ("A token delta on the
// wire") shows such a message header by header.
const (
	HeaderAttempt   = "ce-attempt"
	HeaderOffset    = "ce-offset"
	HeaderTokenLens = "ce-tokenlens"
	HeaderTokenIDs  = "ce-tokenids"

	// ContentTypeText is the Content-Type of a delta whose data is its text.
	ContentTypeText = "text/plain; charset=utf-8"
)

// Header values shared by every message (never modified once built).
var (
	specVersionValue = []string{specVersion}
	tokensTypeValue  = []string{TypeTokensGenerated}
	textValue        = []string{ContentTypeText}
	jsonValue        = []string{contentTypeJSON}
)

// DeltaEncoder writes the token deltas of one attempt. Its constant
// attributes (source, subject, attempt) are validated and formatted once, so
// a delta costs no CloudEvents SDK object and no JSON. It is safe for
// concurrent use: Encode only reads it.
type DeltaEncoder struct {
	source, requestID string
	attempt           int
	sourceV, subjectV []string
	attemptV          []string
}

// NewDeltaEncoder returns the encoder of the deltas of attempt of request
// requestID, produced by source.
func NewDeltaEncoder(source, requestID string, attempt int) (*DeltaEncoder, error) {
	if err := validate("x", TypeTokensGenerated, source); err != nil {
		return nil, fmt.Errorf("events: delta encoder: %w", err)
	}
	if strings.TrimSpace(requestID) == "" || attempt < 0 {
		return nil, fmt.Errorf("events: delta encoder: bad request id %q or attempt %d", requestID, attempt)
	}
	return &DeltaEncoder{
		source: source, requestID: requestID, attempt: attempt,
		sourceV: []string{source}, subjectV: []string{requestID}, attemptV: []string{strconv.Itoa(attempt)},
	}, nil
}

// Encode writes ev, a delta of the encoder's attempt, under event id at t:
// binary with its text as data when it carries only text and ids, else
// as Marshal writes other events.
func (d *DeltaEncoder) Encode(id string, t time.Time, ev TokensGenerated) (Header, []byte, error) {
	return d.EncodeInto(nil, id, t, ev)
}

// EncodeInto is Encode writing the headers into h, cleared first (nil: a
// new map), and returning it: a caller that sends one delta at a time and
// keeps nothing of the last one's headers once it is sent reuses one map,
// the largest allocation of a delta.
func (d *DeltaEncoder) EncodeInto(h Header, id string, t time.Time, ev TokensGenerated) (Header, []byte, error) {
	if ev.RequestID != d.requestID || ev.Attempt != d.attempt {
		return nil, nil, fmt.Errorf("events: delta of %s attempt %d given to the encoder of %s attempt %d",
			ev.RequestID, ev.Attempt, d.requestID, d.attempt)
	}
	if strings.TrimSpace(id) == "" {
		return nil, nil, fmt.Errorf("events: marshal %s: empty id", TypeTokensGenerated)
	}
	// MarshalText's bytes (RFC 3339 with nanoseconds, years 0-9999 only),
	// formatted on the stack: one allocation, the string.
	t = t.UTC()
	if y := t.Year(); y < 0 || y > 9999 {
		return nil, nil, fmt.Errorf("events: marshal %s: time: year %d outside of range [0,9999]", TypeTokensGenerated, y)
	}
	var tsBuf [len(time.RFC3339Nano)]byte
	// The values of the delta's own attributes, in one allocation: id
	// (ce-id and Nats-Msg-Id), time, offset, token lengths, token ids. Each
	// is capped at its length, so that an Add to one reallocates it rather
	// than overwriting the next.
	v := new([5]string)
	v[0], v[1] = id, string(t.AppendFormat(tsBuf[:0], time.RFC3339Nano))
	idV := v[0:1:1]
	// Sized for every attribute a delta may carry, and two that a producer
	// may add (deltaHeaders): a map literal of the seven common ones grew,
	// and rehashed, when the binary form's were added, the largest
	// allocation of a delta.
	if h == nil {
		h = make(Header, deltaHeaders)
	} else {
		clear(h)
	}
	h[HeaderSpecVersion] = specVersionValue
	h[HeaderID] = idV
	h[HeaderType] = tokensTypeValue
	h[HeaderSource] = d.sourceV
	h[HeaderSubject] = d.subjectV
	h[HeaderTime] = v[1:2:2]
	h[HeaderMsgID] = idV
	if !binaryDelta(ev) {
		data, err := jsonMarshal(ev)
		if err != nil {
			return nil, nil, fmt.Errorf("events: marshal %s: %w", TypeTokensGenerated, err)
		}
		h[HeaderContentType] = jsonValue
		return h, data, nil
	}
	h[HeaderContentType] = textValue
	h[HeaderAttempt] = d.attemptV
	v[2] = strconv.Itoa(ev.Offset)
	h[HeaderOffset] = v[2:3:3]
	data := []byte(strings.Join(ev.Tokens, "")) // one copy for the common single token
	if len(ev.Tokens) > 1 {
		v[3] = joinInts(len(ev.Tokens), func(i int) int { return len(ev.Tokens[i]) })
		h[HeaderTokenLens] = v[3:4:4]
	}
	if ev.IDs != nil {
		v[4] = joinInts(len(ev.IDs), func(i int) int { return ev.IDs[i] })
		h[HeaderTokenIDs] = v[4:5:5]
	}
	return h, data, nil
}

// deltaHeaders is how many headers a delta's message may have: the seven
// of every event, Content-Type, attempt, offset, token lengths and ids, and
// two extension attributes that a producer may add and this package does
// not read (a worker adds one, its first delta's upstream time to first
// token, streams.HeaderUpstreamTTFT).
const deltaHeaders = 14

// binaryDelta reports whether ev is written with its text as data: it has
// tokens, and nothing but their text and their ids.
func binaryDelta(ev TokensGenerated) bool {
	return len(ev.Tokens) > 0 && ev.Details == nil && ev.PromptIDs == nil && ev.Model == "" && ev.Exact == nil &&
		(ev.IDs == nil || len(ev.IDs) == len(ev.Tokens))
}

func joinInts(n int, at func(int) int) string {
	if n == 1 {
		return strconv.Itoa(at(0)) // a single-token delta's: one allocation, none below 100
	}
	b := make([]byte, 0, 8*n)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(at(i)), 10)
	}
	return string(b)
}

// decodeDelta reads the binary form of a delta: e holds the validated
// attributes; get reads a header.
func decodeDelta(e Envelope, get func(string) string, data []byte) (TokensGenerated, error) {
	ev := TokensGenerated{RequestID: e.Subject}
	if strings.TrimSpace(e.Subject) == "" {
		return ev, fmt.Errorf("no %s (the request id)", HeaderSubject)
	}
	var err error
	if ev.Attempt, err = strconv.Atoi(get(HeaderAttempt)); err != nil || ev.Attempt < 0 {
		return ev, fmt.Errorf("bad %s %q", HeaderAttempt, get(HeaderAttempt))
	}
	if ev.Offset, err = strconv.Atoi(get(HeaderOffset)); err != nil || ev.Offset < 0 {
		return ev, fmt.Errorf("bad %s %q", HeaderOffset, get(HeaderOffset))
	}
	if ev.Tokens, err = splitTokens(get(HeaderTokenLens), data); err != nil {
		return ev, err
	}
	if v := get(HeaderTokenIDs); v != "" {
		if ev.IDs, err = parseInts(v); err != nil || len(ev.IDs) != len(ev.Tokens) {
			return ev, fmt.Errorf("bad %s %q for %d tokens", HeaderTokenIDs, v, len(ev.Tokens))
		}
	}
	return ev, nil
}

// splitTokens cuts data into tokens of the byte lengths in lens (one token,
// all of data, when lens is empty).
func splitTokens(lens string, data []byte) ([]string, error) {
	if lens == "" {
		return []string{string(data)}, nil
	}
	ns, err := parseInts(lens)
	if err != nil || len(ns) < 2 {
		return nil, fmt.Errorf("bad %s %q", HeaderTokenLens, lens)
	}
	text := string(data) // one copy; the tokens share it
	out := make([]string, len(ns))
	at := 0
	for i, n := range ns {
		if n < 0 || n > len(text)-at {
			return nil, fmt.Errorf("%s %q does not match %d bytes of data", HeaderTokenLens, lens, len(data))
		}
		out[i], at = text[at:at+n], at+n
	}
	if at != len(text) {
		return nil, fmt.Errorf("%s %q does not match %d bytes of data", HeaderTokenLens, lens, len(data))
	}
	return out, nil
}

// parseInts reads a comma-separated list of decimal integers.
func parseInts(s string) ([]int, error) {
	out := make([]int, 0, strings.Count(s, ",")+1)
	for f := range strings.SplitSeq(s, ",") {
		v, err := strconv.Atoi(f)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// isText reports whether a Content-Type names the binary form of a delta.
func isText(ct string) bool {
	return ct == ContentTypeText || strings.HasPrefix(ct, "text/plain")
}
