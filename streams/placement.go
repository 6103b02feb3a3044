package streams

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// One stream leader orders and stores every write of its stream, so the
// request log's write capacity grows with the partitions only if their
// leaders are on different servers. nats-server picks a random online peer
// as a new stream's first leader; SpreadLeaders then moves them apart.

// ErrLeadersNotSpread means the request partitions work but their leaders
// could not be moved apart (for example, the component lacks the permission
// for $JS.API.STREAM.LEADER.STEPDOWN).
var ErrLeadersNotSpread = errors.New("streams: the request partitions' leaders could not be spread over the cluster")

// SpreadBudget bounds how long Provision spends spreading the leaders of the
// partitions it created: a step down and an election take well under a
// second on a healthy cluster, and a component that may not ask for one (its
// request goes unanswered) should not wait long to start.
const SpreadBudget = 10 * time.Second

// Leaders returns the server that leads each partition of p, waiting (until
// ctx ends) for partitions that are electing one.
func Leaders(ctx context.Context, js jetstream.JetStream, p Partitions) ([]string, error) {
	out := make([]string, p.n())
	for k := range out {
		info, err := ledInfo(ctx, js, p.Stream(k))
		if err != nil {
			return nil, err
		}
		if info.Cluster != nil {
			out[k] = info.Cluster.Leader
		}
	}
	return out, nil
}

// SpreadLeaders moves the leaders of p's partitions onto different servers,
// as far as their peers allow: partition by partition, the peer leading the
// fewest partitions so far (ties by name) is chosen, and a partition led
// elsewhere steps down in its favour ($JS.API.STREAM.LEADER.STEPDOWN with a
// preferred placement). It returns once every chosen peer leads. Partitions
// without replicas stay where the server placed them.
func SpreadLeaders(ctx context.Context, js jetstream.JetStream, p Partitions) error {
	led := map[string]int{}
	for k := range p.n() {
		name := p.Stream(k)
		info, err := ledInfo(ctx, js, name)
		if err != nil {
			return err
		}
		if info.Cluster == nil || len(info.Cluster.Replicas) == 0 {
			continue
		}
		peers := []string{info.Cluster.Leader}
		for _, r := range info.Cluster.Replicas {
			peers = append(peers, r.Name)
		}
		pick := slices.MinFunc(peers, func(a, b string) int { return cmp.Or(cmp.Compare(led[a], led[b]), cmp.Compare(a, b)) })
		led[pick]++
		if info.Cluster.Leader == pick {
			continue
		}
		if err := moveLeader(ctx, js, name, pick); err != nil {
			return err
		}
	}
	return nil
}

// moveLeader makes the server named to the leader of stream: it asks the
// leader to step down in to's favour, and asks again if another server won
// the election (a preferred peer is a hint, not an order).
func moveLeader(ctx context.Context, js jetstream.JetStream, stream, to string) error {
	for {
		info, err := ledInfo(ctx, js, stream)
		if err != nil {
			return err
		}
		if info.Cluster == nil || info.Cluster.Leader == to {
			return nil
		}
		if err := stepDown(ctx, js, stream, to); err != nil {
			if info, ierr := ledInfo(ctx, js, stream); ierr == nil && info.Cluster.Leader == to {
				return nil // it won an election meanwhile ("already leader")
			}
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, electionWait)
		err = poll(wctx, spreadBackoffMax, func(ctx context.Context) (bool, error) {
			info, err := ledInfo(ctx, js, stream)
			return err == nil && info.Cluster != nil && info.Cluster.Leader == to, err
		})
		cancel()
		if err != nil && ctx.Err() != nil {
			return fmt.Errorf("streams: wait for %s to lead %s: %w", to, stream, err)
		}
	}
}

// electionWait is how long moveLeader waits for an election before it asks
// again.
const electionWait = 2 * time.Second

// spreadBackoffMax spaces the questions of a wait for a leader: an election
// after a step down takes well under a second.
const spreadBackoffMax = 200 * time.Millisecond

// ledInfo returns a stream's info once it has a leader.
func ledInfo(ctx context.Context, js jetstream.JetStream, name string) (*jetstream.StreamInfo, error) {
	var info *jetstream.StreamInfo
	err := poll(ctx, spreadBackoffMax, func(ctx context.Context) (bool, error) {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return false, err
		}
		info = s.CachedInfo()
		return info.Cluster == nil || info.Cluster.Leader != "", nil
	})
	if err != nil {
		return nil, fmt.Errorf("streams: the leader of %s: %w", name, err)
	}
	return info, nil
}

// stepDown asks the leader of stream to hand over to the server named to.
func stepDown(ctx context.Context, js jetstream.JetStream, stream, to string) error {
	body, err := json.Marshal(map[string]any{"placement": map[string]string{"preferred": to}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
	defer cancel()
	m, err := js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, body)
	if err != nil {
		return fmt.Errorf("streams: step down the leader of %s for %s: %w", stream, to, err)
	}
	var resp struct {
		Error *jetstream.APIError `json:"error,omitempty"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return fmt.Errorf("streams: step down the leader of %s: %w", stream, err)
	}
	if resp.Error != nil {
		return fmt.Errorf("streams: step down the leader of %s for %s: %w", stream, to, resp.Error)
	}
	return nil
}

// poll calls f until it reports done, fails with an error that is not
// Transient, or ctx ends (then it returns f's last error, or ctx's), spacing
// calls with a backoff from 50 ms doubling to maxBackoff; each call gets at
// most DefaultTimeout.
func poll(ctx context.Context, maxBackoff time.Duration, f func(ctx context.Context) (bool, error)) error {
	backoff := appendBackoffMin
	for {
		tctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
		done, err := f(tctx)
		cancel()
		if done {
			return nil
		}
		if err != nil && !Transient(err) {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return cmp.Or(err, ctx.Err())
		}
		backoff = min(2*backoff, maxBackoff)
	}
}
