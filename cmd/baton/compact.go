package main

import (
	"context"
	"fmt"
	"time"

	"github.com/baton-dev/baton/services/retention"
)

const compactSummary = `Compacts finished requests by hand: folds each one's token deltas into its
compact record (baton.request.compacted.v1, on its events subject) and purges
its tokens subjects, exactly as the owning frontend does when a request ends
(unless it runs with --log-compaction=false). Every rendering of the request
(the unary answer, an SSE resume from any offset, GET /v1/requests/{id},
baton replay's state and output) is unchanged; baton replay then shows the
record in place of the deltas. A request still running is refused. Run it with
a frontend's NATS credentials (it appends to the events subject and purges).
Exits 1 if any request could not be compacted.`

// compactTimeout bounds the compaction of one request.
const compactTimeout = 30 * time.Second

func runCompact(ctx context.Context, env *environment, args []string) error {
	f := newFlagSet("compact", compactSummary, env.lookup, env.stdout)
	f.args = "<request-id>..."
	common, nf := addCommonFlags(f), addNATSFlags(f)
	ids, err := parseInterspersed(f, args)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return usagef("want at least one request id (see 'baton compact --help')")
	}
	if err := checkRequestIDs(ids); err != nil {
		return err
	}
	if err := nf.validate(); err != nil {
		return err
	}
	nc, log, parts, err := connectLog(ctx, env, common, nf, "compact")
	if nc == nil {
		return err
	}
	defer nc.Close()
	return eachRequest(ctx, ids, compactTimeout, func(ctx context.Context, id string) error {
		err := retention.CompactFromLog(ctx, log, parts, id)
		if err == nil {
			fmt.Fprintf(env.stdout, "compacted %s\n", id)
		}
		return err
	})
}
