package main

import (
	"context"
	"fmt"
	"time"

	"github.com/baton-dev/baton/services/retention"
	"github.com/baton-dev/baton/streams"
)

const evictSummary = `Removes requests from the event log by hand, running or finished: the
operator's lever when the log is full and waiting for eviction is not an
option (docs/debugging.md). Name requests by id (with API keys, a tenant's
request is <tenant>:<its X-Request-Id>), or every request of one tenant that
began before a time (--tenant T --before TIME). A request still running is
first cancelled as a kill: the cancel is stored in the log when it has room,
its end in the ends place (BATON_ENDS) in any case, so every frontend that
follows it ends its streams, and the worker of its current attempt is told to
stop, so that nothing keeps writing to its subjects; --grace later (1s) every
subject of the request is purged. A request evicted answers 404, as an
expired one. Run it with a frontend's NATS credentials.
Exits 1 if a request is not in the log or could not be evicted, 2 for bad
flags.`

// evictTimeout bounds the eviction of one request.
const evictTimeout = 30 * time.Second

func runEvict(ctx context.Context, env *environment, args []string) error {
	f := newFlagSet("evict", evictSummary, env.lookup, env.stdout)
	f.args = "<request-id>... | --tenant T --before TIME"
	common, nf := addCommonFlags(f), addNATSFlags(f)
	var tenant, before string
	var grace time.Duration
	f.StringVar(&tenant, "tenant", "", "evict every request of this `tenant` that began before --before")
	f.StringVar(&before, "before", "", "with --tenant: an RFC 3339 `time`, or a duration ago (2h)")
	f.DurationVar(&grace, "grace", time.Second, "how long a cancelled request's worker has to stop before its subjects are purged, a `duration`")
	ids, err := parseInterspersed(f, args)
	if err != nil {
		return err
	}
	var cutoff time.Time
	switch {
	case tenant == "" && before == "" && len(ids) == 0:
		return usagef("want request ids, or --tenant and --before (see 'baton evict --help')")
	case (tenant == "") != (before == ""):
		return usagef("--tenant and --before go together")
	case tenant != "" && len(ids) > 0:
		return usagef("request ids or --tenant, not both")
	case tenant != "":
		if !streams.ValidID(tenant) {
			return usagef("%q is not a tenant (letters, digits, '-', '_')", tenant)
		}
		if cutoff, err = parseBefore(before, time.Now()); err != nil {
			return err
		}
	}
	if err := checkRequestIDs(ids); err != nil {
		return err
	}
	if grace < 0 {
		return usagef("--grace %v: must not be negative", grace)
	}
	if err := nf.validate(); err != nil {
		return err
	}
	nc, log, parts, err := connectLog(ctx, env, common, nf, "evict")
	if nc == nil {
		return err
	}
	defer nc.Close()
	if tenant != "" {
		if ids, err = retention.TenantRequests(ctx, log, parts, tenant, cutoff); err != nil {
			return err
		}
		fmt.Fprintf(env.stdout, "%d requests of %s began before %s\n", len(ids), tenant, cutoff.Format(time.RFC3339))
	}
	return eachRequest(ctx, ids, evictTimeout, func(ctx context.Context, id string) error {
		got, err := retention.EvictByHand(ctx, log, parts, id, grace)
		if err != nil {
			return err
		}
		if got.Cancelled {
			fmt.Fprintf(env.stdout, "evicted %s (it was running: cancelled first; %d messages purged)\n", id, got.Purged)
		} else {
			fmt.Fprintf(env.stdout, "evicted %s (%d messages purged)\n", id, got.Purged)
		}
		return nil
	})
}

// parseBefore reads --before: an RFC 3339 time, or a duration before now.
func parseBefore(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, usagef("--before %q: want an RFC 3339 time (2026-12-02T15:00:00Z) or a duration ago (2h)", s)
}
