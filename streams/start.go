package streams

import (
	"context"
	"errors"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"
)

// ProvisionAtStart is the prelude of every component that starts on the
// log: Provision, giving up when ctx is done or after StartBudget. Leaders
// that could not be spread over a cluster are worth a warning on log, not a
// failure.
func ProvisionAtStart(ctx context.Context, js jetstream.JetStream, cfg Config, log *slog.Logger) (Partitions, error) {
	ctx, cancel := context.WithTimeout(ctx, StartBudget)
	defer cancel()
	parts, err := Provision(ctx, js, cfg)
	if errors.Is(err, ErrLeadersNotSpread) {
		log.Warn("request partitions", "partitions", parts.Count(), "err", err)
		return parts, nil
	}
	return parts, err
}
