package main

import (
	"context"
	"errors"
	"time"

	"github.com/baton-dev/baton/streams"
)

// What the by-hand tools that write to the request log (baton compact,
// baton evict) share: the check of the ids they are given, the log they
// write through, and the loop over the requests.

// checkRequestIDs refuses (a usage error) the first of ids that is not a
// request id.
func checkRequestIDs(ids []string) error {
	for _, id := range ids {
		if !streams.ValidRequestID(id) {
			return usagef("%q is not a request id (letters, digits, '-', '_', or <tenant>:<id>)", id)
		}
	}
	return nil
}

// connectLog is connectTool and the request log tool name writes through,
// as frontend "baton/frontend/"+name. A nil conn with a nil error means ctx
// was done.
func connectLog(ctx context.Context, env *environment, common *commonFlags, nf *natsFlags, name string) (*conn, *streams.Log, streams.Partitions, error) {
	nc, js, parts, err := connectTool(ctx, env, common, nf, name)
	if nc == nil {
		return nil, nil, parts, err
	}
	log := streams.NewLog(js, "baton/frontend/"+name)
	log.SetPartitions(parts)
	return nc, log, parts, nil
}

// eachRequest runs do on each of ids in turn, each within timeout, and
// joins what failed; a request not in the log fails as errRequestNotFound.
func eachRequest(ctx context.Context, ids []string, timeout time.Duration, do func(ctx context.Context, id string) error) error {
	var errs []error
	for _, id := range ids {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		err := do(rctx, id)
		cancel()
		switch {
		case errors.Is(err, streams.ErrNotFound):
			errs = append(errs, errRequestNotFound(id))
		case err != nil:
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
