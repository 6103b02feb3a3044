package runner

import (
	"fmt"
	"slices"
	"sync"

	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
)

// livePendingBytes bounds the republished messages the frontend's live
// subscription holds undelivered; past it NATS drops them (a slow
// consumer), and each follower sees the gap in Nats-Last-Sequence and reads
// the log.
const livePendingBytes = 256 << 20

// live is the frontend's one subscription to every request's republished
// subjects (streams.RequestsLive), instead of one per followed request: a
// subscription per stream costs a goroutine, a pending queue and a server
// interest each, thousands of times over. Its callback parses the request
// id from the subject (streams.ParseRequestSubject) and hands the message to
// that request's followers, in the order NATS delivered it; messages of
// requests nobody here follows are dropped. The callback does no I/O: a
// follower's onLive only applies or queues.
//
// The subscription is made once; registering a follower is then what
// subscribing to a request used to be: what was republished before is read
// from the log (follow's history), what comes after reaches the follower.
type live struct {
	sub *nats.Subscription

	mu        sync.RWMutex
	followers map[string][]*follower
}

func newLive(nc *nats.Conn) (*live, error) {
	l := &live{followers: map[string][]*follower{}}
	sub, err := nc.Subscribe(streams.RequestsLive(), l.deliver)
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", streams.RequestsLive(), err)
	}
	_ = sub.SetPendingLimits(-1, livePendingBytes)
	l.sub = sub
	return l, nil
}

func (l *live) deliver(m *nats.Msg) {
	subj, err := streams.ParseRequestSubject(m.Subject)
	if err != nil {
		return
	}
	l.mu.RLock()
	fs := l.followers[subj.ID]
	l.mu.RUnlock()
	for _, f := range fs {
		f.onLive(m)
	}
}

// add registers f for its request's messages from now on.
func (l *live) add(f *follower) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.followers[f.id] = append(slices.Clip(l.followers[f.id]), f)
}

// remove stops delivering to f. A delivery that read the list before may
// still call f once (deliver holds no lock while it calls): onLive only
// queues for a stopped follower.
func (l *live) remove(f *follower) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fs := slices.DeleteFunc(slices.Clone(l.followers[f.id]), func(g *follower) bool { return g == f })
	if len(fs) == 0 {
		delete(l.followers, f.id)
		return
	}
	l.followers[f.id] = fs
}

// close ends the subscription.
func (l *live) close() error { return l.sub.Unsubscribe() }
