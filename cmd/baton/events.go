package main

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

const eventsSummary = `Pretty-prints the event log: the messages of BATON_REQUESTS (or of
every request partition, BATON_REQUESTS_<k>, learnt from the server) and
BATON_WORKERS, one line each (stored time, stream sequence, ce-type, subject,
and a summary of the event), merged in time order. Without --follow it prints
what is stored and exits; with --follow it then keeps printing new events
until SIGINT. --request ID shows only baton.requests.<slot>.<ID>.>, --worker ID only
baton.workers.<ID>.> (both may be given). Messages of an unknown type are shown
as "(unknown type ...)", not skipped. --json prints one JSON object per line.
Reads with ordered consumers, which the server removes when the tool exits.`

// toolConnectTimeout bounds how long a tool waits for a NATS server: a
// person is waiting, and the server should already be up.
const toolConnectTimeout = 5 * time.Second

// eventsOptions are the flags of `baton events`.
type eventsOptions struct {
	common  *commonFlags
	nats    *natsFlags
	follow  bool
	request string
	worker  string
	json    bool
	since   time.Duration
}

func parseEvents(env *environment, args []string) (*eventsOptions, error) {
	f := newFlagSet("events", eventsSummary, env.lookup, env.stdout)
	o := &eventsOptions{common: addCommonFlags(f), nats: addNATSFlags(f)}
	f.BoolVar(&o.follow, "follow", false, "after what is stored, keep printing new events until SIGINT")
	f.StringVar(&o.request, "request", "", "only the events of this request `id` (<tenant>:<id> for a tenant's request)")
	f.StringVar(&o.worker, "worker", "", "only the events of this worker `id`")
	f.BoolVar(&o.json, "json", false, "one JSON object per event and line")
	f.DurationVar(&o.since, "since", 0, "only events stored in the last `duration` (e.g. 10m)")
	f.showDefault("since", "all")
	if err := f.parse(args); err != nil {
		return nil, err
	}
	var errs []error
	if err := o.nats.validate(); err != nil {
		errs = append(errs, err)
	}
	if o.request != "" && !streams.ValidRequestID(o.request) {
		errs = append(errs, fmt.Errorf("--request %q: not a request id", o.request))
	}
	if o.worker != "" && !streams.ValidID(o.worker) {
		errs = append(errs, fmt.Errorf("--worker %q: not a worker id", o.worker))
	}
	if o.since < 0 {
		errs = append(errs, fmt.Errorf("--since %v: must not be negative", o.since))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, usageError{err}
	}
	return o, nil
}

// sources are the streams and subject filters the options select, in a
// request log of parts partitions: every partition, or the one of --request.
func (o *eventsOptions) sources(parts streams.Partitions) []logSource {
	var out []logSource
	switch {
	case o.request == "" && o.worker == "":
		for _, name := range parts.Streams() {
			out = append(out, logSource{name, ""})
		}
		return append(out, logSource{streams.WorkersStream, ""})
	case o.request != "":
		out = append(out, logSource{parts.StreamOf(o.request), streams.RequestAll(o.request)})
	}
	if o.worker != "" {
		out = append(out, logSource{streams.WorkersStream, "baton.workers." + o.worker + ".>"})
	}
	return out
}

func runEvents(ctx context.Context, env *environment, args []string) error {
	o, err := parseEvents(env, args)
	if err != nil {
		return err
	}
	nc, js, parts, err := connectTool(ctx, env, o.common, o.nats, "events")
	if nc == nil {
		return err // nil when ctx ended while connecting
	}
	defer nc.Close()
	var workers projections.WorkerLog // why a frontend ignores a worker event
	print := func(r logRecord) error {
		if r.Stream == streams.WorkersStream && r.Err == nil {
			r.Env.Stored = r.Subject
			r.Why = workers.Check(r.Env)
		}
		var line string
		if o.json {
			b, err := json.Marshal(r.jsonRecord())
			if err != nil {
				return err
			}
			line = string(b)
		} else {
			line = r.line()
		}
		_, err := fmt.Fprintln(env.stdout, line)
		return err
	}
	err = tailLog(ctx, js, o.sources(parts), o.since, o.follow, print)
	if ctx.Err() != nil {
		return nil // SIGINT: a normal end of --follow
	}
	return err
}

// logSource is a stream and an optional subject filter.
type logSource struct {
	stream, filter string
}

// logRecord is one stored message of a baton stream, decoded as far as this
// build can.
type logRecord struct {
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

// tailLog prints the stored messages of the sources merged in stored-time
// order, then, with follow, new messages as they arrive until ctx ends.
func tailLog(ctx context.Context, js jetstream.JetStream, srcs []logSource, since time.Duration, follow bool, print func(logRecord) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tails := make([]*tail, 0, len(srcs))
	for _, s := range srcs {
		t, err := startTail(ctx, js, s, since)
		if err != nil {
			return err
		}
		defer t.stop()
		tails = append(tails, t)
	}
	// History: a two-way (n-way) merge by stored time of what each stream
	// held when the tool started.
	heads := make([]*logRecord, len(tails))
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
	merged := make(chan logRecord)
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
	src      logSource
	msgs     jetstream.MessagesContext
	lastSeq  uint64 // the stream's last sequence when the tail started
	caughtUp bool   // every message stored before the start was returned
}

func startTail(ctx context.Context, js jetstream.JetStream, src logSource, since time.Duration) (*tail, error) {
	rctx, cancel := context.WithTimeout(ctx, streams.DefaultTimeout)
	defer cancel()
	st, err := js.Stream(rctx, src.stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w (is anything of baton running against this server?)", src.stream, err)
	}
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if src.filter != "" {
		cfg.FilterSubjects = []string{src.filter}
	}
	if since > 0 {
		cfg.DeliverPolicy = jetstream.DeliverByStartTimePolicy
		start := time.Now().Add(-since)
		cfg.OptStartTime = &start
	}
	cons, err := st.OrderedConsumer(rctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", src.stream, err)
	}
	msgs, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", src.stream, err)
	}
	t := &tail{src: src, msgs: msgs, lastSeq: st.CachedInfo().State.LastSeq}
	if info := cons.CachedInfo(); t.lastSeq == 0 || (info != nil && info.NumPending == 0) {
		t.caughtUp = true
	}
	return t, nil
}

func (t *tail) stop() { t.msgs.Stop() }

// next returns the next message, waiting for one; it fails once ctx ends.
func (t *tail) next(ctx context.Context) (logRecord, error) {
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
		return logRecord{}, ctx.Err()
	}
	if res.err != nil {
		return logRecord{}, fmt.Errorf("read %s: %w", t.src.stream, res.err)
	}
	r := logRecord{Stream: t.src.stream, Subject: res.m.Subject(), Data: res.m.Data()}
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

// line is the record as one line of text.
func (r logRecord) line() string {
	return fmt.Sprintf("%s  %-8s %-7d %-32s %-40s %s",
		r.Stored.UTC().Format("2006-01-02T15:04:05.000Z"), shortStream(r.Stream), r.Seq,
		orDash(r.Type), r.Subject, r.summary())
}

// summary describes the event, or why it cannot be.
func (r logRecord) summary() string {
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

// jsonRecord is the --json shape of a record.
type jsonRecord struct {
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

func (r logRecord) jsonRecord() jsonRecord {
	j := jsonRecord{Stream: r.Stream, Seq: r.Seq, Stored: r.Stored, Subject: r.Subject, Type: r.Type,
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
// partition k, "workers".
func shortStream(s string) string {
	switch s {
	case streams.RequestsStream:
		return "requests"
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
