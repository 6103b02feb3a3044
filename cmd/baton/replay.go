package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/baton-dev/baton/services/logtool"
	"github.com/baton-dev/baton/streams"
)

const replaySummary = `Rebuilds a request's timeline from the event log alone (BATON_REQUESTS, or
the request's partition BATON_REQUESTS_<k> when the log is partitioned: the
server says how, the id's hash slot says which; read with batch direct get, folded exactly as a frontend folds it): one line per
event in stream order, with the time since the request was accepted, the
stream sequence, the subject (events, or tokens.<attempt>) and what happened.
Consecutive token deltas of one attempt are shown as one line; deltas the fold
ignored (a zombie worker writing after its attempt was fenced, a duplicate)
are marked. Then a summary (status, attempts, migrations, owner, tokens,
finish reason) and the output text exactly as clients received it. Once a
request is compacted, its deltas are gone: the record's line says which tokens
each attempt produced, and the answer a compaction writes again for older
readers is shown as their carry, not as an attempt's work.
--json prints {"stream", "request": state, "timeline": [every event], "output":
text, "response": the answer its client got (a response's object, a chat or
text completion)}.
With API keys, a tenant's request is <tenant>:<its X-Request-Id> (alice:r1).
Exits 1 if the request is not in the log.`

// replayOptions are the flags and argument of `baton replay`.
type replayOptions struct {
	common *commonFlags
	nats   *natsFlags
	json   bool
	id     string
}

func parseReplay(env *environment, args []string) (*replayOptions, error) {
	f := newFlagSet("replay", replaySummary, env.lookup, env.stdout)
	f.args = "<request-id>"
	o := &replayOptions{common: addCommonFlags(f), nats: addNATSFlags(f)}
	f.BoolVar(&o.json, "json", false, "print one JSON document for machines")
	pos, err := parseInterspersed(f, args)
	if err != nil {
		return nil, err
	}
	if len(pos) != 1 {
		return nil, usagef("want one request id, got %d arguments (see 'baton replay --help')", len(pos))
	}
	o.id = pos[0]
	if !streams.ValidRequestID(o.id) {
		return nil, usagef("%q is not a request id (letters, digits, '-', '_', or <tenant>:<id>)", o.id)
	}
	return o, o.nats.validate()
}

// parseInterspersed parses flags that may come before or after positional
// arguments ("baton replay ID --json"), and returns the positional ones.
func parseInterspersed(f *flagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := f.parse(args); err != nil {
			return nil, err
		}
		if f.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, f.Arg(0))
		args = f.Args()[1:]
	}
}

// errRequestNotFound is the message for an id that has no history.
func errRequestNotFound(id string) error {
	return fmt.Errorf("request %s not found in the log (never accepted, or past retention)", id)
}

func runReplay(ctx context.Context, env *environment, args []string) error {
	o, err := parseReplay(env, args)
	if err != nil {
		return err
	}
	nc, js, parts, err := connectTool(ctx, env, o.common, o.nats, "replay")
	if nc == nil {
		return err // nil when ctx ended while connecting
	}
	defer nc.Close()
	doc, err := logtool.ReadReplay(ctx, js, parts, o.id)
	if errors.Is(err, streams.ErrNotFound) {
		return errRequestNotFound(o.id)
	}
	if err != nil {
		return err
	}
	if o.json {
		enc := json.NewEncoder(env.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(doc)
	}
	return logtool.WriteReplay(env.stdout, doc)
}
