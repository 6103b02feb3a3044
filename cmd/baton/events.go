package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/logtool"
	"github.com/baton-dev/baton/streams"
)

const eventsSummary = `Pretty-prints the event log: the messages of BATON_REQUESTS (or of
every request partition, BATON_REQUESTS_<k>, learnt from the server),
BATON_ENDS (where it exists) and BATON_WORKERS, one line each (stored time,
stream sequence, ce-type, subject, and a summary of the event), merged in time
order. Without --follow it prints what is stored and exits; with --follow it
then keeps printing new events until SIGINT. --request ID shows only
baton.requests.<slot>.<ID>.> and baton.ends.<slot>.<ID>, --worker ID only
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
	print := func(r logtool.Record) error {
		if r.Stream == streams.WorkersStream && r.Err == nil {
			r.Env.Stored = r.Subject
			r.Why = workers.Check(r.Env)
		}
		var line string
		if o.json {
			b, err := json.Marshal(r.JSON())
			if err != nil {
				return err
			}
			line = string(b)
		} else {
			line = r.Line()
		}
		_, err := fmt.Fprintln(env.stdout, line)
		return err
	}
	err = logtool.Tail(ctx, js, logtool.Sources(parts, o.request, o.worker), o.since, o.follow, print)
	if ctx.Err() != nil {
		return nil // SIGINT: a normal end of --follow
	}
	return err
}
