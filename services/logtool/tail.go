package logtool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// Source is a stream and an optional subject filter.
type Source struct {
	Stream, Filter string
	// Optional: the stream may not exist (the ends place, on a log that a
	// release before it provisioned), and is then not read.
	Optional bool
}

// Sources are the streams and subject filters of a request log of parts
// partitions that `baton events` reads: every partition, the ends place
// and the workers stream, or, with request or worker set, the subjects of
// each.
func Sources(parts streams.Partitions, request, worker string) []Source {
	var out []Source
	switch {
	case request == "" && worker == "":
		for _, name := range parts.Streams() {
			out = append(out, Source{Stream: name})
		}
		return append(out, Source{Stream: streams.EndsStream, Optional: true}, Source{Stream: streams.WorkersStream})
	case request != "":
		out = append(out, Source{Stream: parts.StreamOf(request), Filter: streams.RequestAll(request)},
			Source{Stream: streams.EndsStream, Filter: streams.RequestEnd(request), Optional: true})
	}
	if worker != "" {
		out = append(out, Source{Stream: streams.WorkersStream, Filter: "baton.workers." + worker + ".>"})
	}
	return out
}

// Record is one stored message of a baton stream, decoded as far as this
// build can.
type Record struct {
	Stream  string
	Seq     uint64
	Subject string
	Stored  time.Time
	Type    string // ce-type header, even when the type is unknown
	Env     events.Envelope
	Err     error // decode error: events.ErrUnknownType, events.ErrNotEvent, ...
	Data    []byte
	Why     string // why the readers ignore the event, if they do
}

// Tail prints the stored messages of the sources merged in stored-time
// order (only those stored in the last since, if positive), then, with
// follow, new messages as they arrive until ctx ends, when it returns ctx's
// error.
func Tail(ctx context.Context, js jetstream.JetStream, srcs []Source, since time.Duration, follow bool, print func(Record) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tails := make([]*tail, 0, len(srcs))
	for _, s := range srcs {
		t, err := startTail(ctx, js, s, since)
		if s.Optional && errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		defer t.stop()
		tails = append(tails, t)
	}
	// History: a two-way (n-way) merge by stored time of what each stream
	// held when the tool started.
	heads := make([]*Record, len(tails))
	for {
		for i, t := range tails {
			if heads[i] != nil || t.caughtUp {
				continue
			}
			r, err := t.next(ctx)
			if err != nil {
				return err
			}
			heads[i] = &r
		}
		first := -1
		for i, h := range heads {
			if h != nil && (first < 0 || h.Stored.Before(heads[first].Stored)) {
				first = i
			}
		}
		if first < 0 {
			break
		}
		if err := print(*heads[first]); err != nil {
			return err
		}
		heads[first] = nil
	}
	if !follow {
		return nil
	}
	// Live: whatever comes next, from any stream, as it comes.
	merged := make(chan Record)
	for _, t := range tails {
		go func() {
			for {
				r, err := t.next(ctx)
				if err != nil {
					return
				}
				select {
				case merged <- r:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case r := <-merged:
			if err := print(r); err != nil {
				return err
			}
		}
	}
}

// tail reads one stream through an ordered consumer.
type tail struct {
	src      Source
	msgs     jetstream.MessagesContext
	lastSeq  uint64 // the stream's last sequence when the tail started
	caughtUp bool   // every message stored before the start was returned
}

func startTail(ctx context.Context, js jetstream.JetStream, src Source, since time.Duration) (*tail, error) {
	rctx, cancel := context.WithTimeout(ctx, streams.DefaultTimeout)
	defer cancel()
	st, err := js.Stream(rctx, src.Stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w (is anything of baton running against this server?)", src.Stream, err)
	}
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if src.Filter != "" {
		cfg.FilterSubjects = []string{src.Filter}
	}
	if since > 0 {
		cfg.DeliverPolicy = jetstream.DeliverByStartTimePolicy
		start := time.Now().Add(-since)
		cfg.OptStartTime = &start
	}
	cons, err := st.OrderedConsumer(rctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", src.Stream, err)
	}
	msgs, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", src.Stream, err)
	}
	t := &tail{src: src, msgs: msgs, lastSeq: st.CachedInfo().State.LastSeq}
	if info := cons.CachedInfo(); t.lastSeq == 0 || (info != nil && info.NumPending == 0) {
		t.caughtUp = true
	}
	return t, nil
}

func (t *tail) stop() { t.msgs.Stop() }

// next returns the next message, waiting for one; it fails once ctx ends.
func (t *tail) next(ctx context.Context) (Record, error) {
	type result struct {
		m   jetstream.Msg
		err error
	}
	c := make(chan result, 1)
	go func() {
		m, err := t.msgs.Next()
		c <- result{m, err}
	}()
	var res result
	select {
	case res = <-c:
	case <-ctx.Done():
		t.msgs.Stop() // unblocks Next
		return Record{}, ctx.Err()
	}
	if res.err != nil {
		return Record{}, fmt.Errorf("read %s: %w", t.src.Stream, res.err)
	}
	r := Record{Stream: t.src.Stream, Subject: res.m.Subject(), Data: res.m.Data()}
	if md, err := res.m.Metadata(); err == nil {
		r.Seq, r.Stored = md.Sequence.Stream, md.Timestamp
		if md.NumPending == 0 || r.Seq >= t.lastSeq {
			t.caughtUp = true
		}
	}
	h := res.m.Headers()
	r.Type = h.Get(events.HeaderType)
	r.Env, r.Err = events.Unmarshal(events.Header(h), res.m.Data())
	r.Env.Seq = r.Seq
	return r, nil
}

// Line is the record as one line of text.
func (r Record) Line() string {
	return fmt.Sprintf("%s  %-8s %-7d %-32s %-40s %s",
		r.Stored.UTC().Format("2006-01-02T15:04:05.000Z"), shortStream(r.Stream), r.Seq,
		orDash(r.Type), r.Subject, r.summary())
}

// summary describes the event, or why it cannot be.
func (r Record) summary() string {
	switch {
	case r.Err == nil && r.Env.Event != nil && r.Why != "":
		return describe(r.Env) + "  " + r.Why
	case r.Err == nil && r.Env.Event != nil:
		return describe(r.Env)
	case errors.Is(r.Err, events.ErrUnknownType):
		return fmt.Sprintf("(unknown type %s, %d bytes)", r.Type, len(r.Data))
	case errors.Is(r.Err, events.ErrNotEvent):
		return fmt.Sprintf("(not a baton event, %d bytes)", len(r.Data))
	case r.Err != nil:
		return fmt.Sprintf("(undecodable: %v)", r.Err)
	}
	return ""
}

// JSONRecord is the --json shape of a record.
type JSONRecord struct {
	Stream  string          `json:"stream"`
	Seq     uint64          `json:"seq"`
	Stored  time.Time       `json:"stored"`
	Subject string          `json:"subject"`
	Type    string          `json:"type,omitempty"`
	ID      string          `json:"id,omitempty"`
	Source  string          `json:"source,omitempty"`
	Time    *time.Time      `json:"time,omitempty"`
	Summary string          `json:"summary"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// JSON is the record in its --json shape.
func (r Record) JSON() JSONRecord {
	j := JSONRecord{Stream: r.Stream, Seq: r.Seq, Stored: r.Stored, Subject: r.Subject, Type: r.Type,
		ID: r.Env.ID, Source: r.Env.Source, Summary: r.summary()}
	if !r.Env.Time.IsZero() {
		t := r.Env.Time
		j.Time = &t
	}
	switch {
	case r.Env.Event != nil: // the event as JSON, whether its data was JSON or a delta's text
		j.Data, _ = json.Marshal(r.Env.Event)
	case json.Valid(r.Data):
		j.Data = r.Data
	}
	return j
}

// shortStream names a stream in a line: "requests", "req.<k>" for request
// partition k, "ends", "workers".
func shortStream(s string) string {
	switch s {
	case streams.RequestsStream:
		return "requests"
	case streams.EndsStream:
		return "ends"
	case streams.WorkersStream:
		return "workers"
	}
	if k, ok := strings.CutPrefix(s, streams.RequestsStream+"_"); ok {
		return "req." + k
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// producer is the last part of an event source: "baton/frontend/fe-1" → "fe-1".
func producer(source string) string {
	return source[strings.LastIndex(source, "/")+1:]
}

// describe, tokenRange and kindOf are the projections' summaries of events,
// shared with the console.
var (
	describe   = projections.Describe
	tokenRange = projections.TokenRange
	kindOf     = projections.Kind
)
