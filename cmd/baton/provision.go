package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

const provisionSummary = `Creates the event log's streams and buckets (the request partitions,
BATON_WORKERS, baton_leases, baton_load, baton_frontends, baton_budgets,
BATON_ENDS) with the given
--replicas and --stream-* flags if they do not exist, and verifies every one
that does against them: a difference in subjects, RePublish, limits, discard,
retention, storage, replicas or metadata exits 2 naming it. With --update it
changes the existing streams to these flags instead (what JetStream cannot
change in place, such as storage, it refuses: remove that stream first).
Workers never create the log; a frontend does at start, or an operator runs
this once with a credential that may create streams. Every component must
then be started with the same --replicas and --stream-* flags.`

type provisionOptions struct {
	common  *commonFlags
	nats    *natsFlags
	streams *streamFlags
	update  bool
}

func parseProvision(env *environment, args []string) (*provisionOptions, error) {
	f := newFlagSet("provision", provisionSummary, env.lookup, env.stdout)
	o := &provisionOptions{common: addCommonFlags(f), nats: addNATSFlags(f), streams: addStreamFlags(f)}
	f.BoolVar(&o.update, "update", false, "change existing streams and buckets to these flags instead of refusing them")
	if err := f.parse(args); err != nil {
		return nil, err
	}
	var errs []error
	if err := o.nats.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := o.streams.config().Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, usageError{err}
	}
	return o, nil
}

func runProvision(ctx context.Context, env *environment, args []string) error {
	o, err := parseProvision(env, args)
	if err != nil {
		return err
	}
	log := o.common.logger(env.stderr, "provision")
	nc, err := connectNATS(ctx, o.nats.urls, "baton-provision", toolConnectTimeout, log, o.nats.options()...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc.Conn)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, streams.StartBudget)
	defer cancel()
	cfg := o.streams.config()
	var parts streams.Partitions
	if o.update {
		var changed []string
		parts, changed, err = streams.Update(pctx, js, cfg)
		for _, c := range changed {
			fmt.Fprintln(env.stdout, "updated", c)
		}
	} else {
		parts, err = streams.Provision(pctx, js, cfg)
	}
	if errors.Is(err, streams.ErrLeadersNotSpread) {
		log.Warn("request partitions", "err", err)
	} else if err != nil {
		return err
	}
	names := make([]string, 0, 8)
	for _, d := range cfg.Definitions(parts) {
		names = append(names, d.Name)
	}
	fmt.Fprintf(env.stdout, "provisioned and verified: %s\n", strings.Join(names, ", "))
	return nil
}
