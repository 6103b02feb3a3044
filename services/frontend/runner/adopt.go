package runner

import (
	"cmp"
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
)

// Orphans are adopted (docs/fault-tolerance.md, "Orphans are adopted"). A
// request meant to outlive its client (a background response, a request
// sent with X-Resumable) whose owner frontend is gone is taken over by a
// live frontend without waiting for a reader:
//
//   - Each frontend lists the adoptable requests it owns and runs in its
//     presence key (events.FrontendPresence.Adoptable), by where their
//     accepted event is stored, not by id: workers read that bucket. The
//     list is written again when it changes, at most every adoptableEvery,
//     and with every renewal.
//   - Every frontend watches the frontends bucket already (services/fleet):
//     when a key goes (expired, deleted by the disconnect advisory or by a
//     shutdown), each live frontend has the departed one's last list. For
//     each entry the live frontends are ranked by a hash of the entry and
//     their ids (rendezvous hashing): the first tries at once, the next
//     adoptStagger later unless a live frontend lists the request by then,
//     and so on. Of frontends that try at once (views differ for a moment),
//     the attached event's expected sequence lets one win (invariant 3).
//   - To adopt is to read the accepted event at that position (one direct
//     get), follow the request, start its detach clock when no client is
//     attached here, and take it over as a reader's Claim does
//     (ensureOwner): it migrates if its worker is gone too.
//
// The cost: nothing per token and nothing on a request's path but one
// entry in a set; a presence write per adoptableEvery while the set
// changes (the list is about 20 bytes an entry, at most maxAdoptable
// entries), which every frontend and worker watching the bucket receives;
// and, when a frontend goes, one direct get per listed request by each live
// frontend whose turn comes (normally one), and a follow by the adopter.

// adoptableEvery is the least time between two writes of the presence list;
// a request accepted less than that before its frontend died may be missing
// from the last list (it is then taken over only by a reader, as before).
const adoptableEvery = 100 * time.Millisecond

// adoptStagger is how long a frontend waits per rank before it adopts a
// request that a frontend ranked before it should have (a third of the
// presence TTL: three ranks try within one TTL).
const adoptStagger = presenceTTL / 3

// maxAdoptable bounds the list in a presence key (about 90 KB of JSON);
// requests past it are not listed, and are taken over only by a reader.
const maxAdoptable = 4096

// adoptParallel bounds the adoptions one frontend carries out at once.
const adoptParallel = 8

// adoptable is the set of adoptable requests this frontend runs. It is
// safe for concurrent use.
type adoptable struct {
	mu      sync.Mutex
	set     map[events.StoredAt]struct{}
	changed chan struct{} // capacity 1: changes coalesce
}

// adopter lists the adoptable requests this frontend runs in its presence
// key, and adopts those of the frontends that depart.
type adopter struct {
	id       string // this frontend's
	log      *slog.Logger
	js       jetstream.JetStream
	parts    streams.Partitions // set by Start (Runner.provision) before anything reads it
	fleet    Fleet              // who is live, and what the departed listed
	presence *presence          // this frontend's key, where its list goes
	listed   *adoptable
	adopted  prometheus.Counter
	runtime  takeOver
	// all lists every request this frontend runs, not only those that
	// outlive their clients (--batched-output): a batched attempt's end
	// reaches the request log only through a frontend that follows it
	// (batched.go), so one whose owner died is adopted whatever its kind.
	all bool
}

// takeOver is what adoption needs of the runtime (Runner): to follow a
// request, to take it over (and run it here) if its owner is gone, and to
// take over the requests with a batched attempt it follows of a frontend
// that departed.
type takeOver interface {
	Attach(ctx context.Context, id string) (*Request, error)
	ensureOwner(ctx context.Context, t *Request)
	claimBatched(ctx context.Context, owner string)
}

func newAdoptable() *adoptable {
	return &adoptable{set: map[events.StoredAt]struct{}{}, changed: make(chan struct{}, 1)}
}

func (a *adoptable) add(at events.StoredAt)    { a.edit(func() { a.set[at] = struct{}{} }) }
func (a *adoptable) remove(at events.StoredAt) { a.edit(func() { delete(a.set, at) }) }

func (a *adoptable) edit(fn func()) {
	a.mu.Lock()
	fn()
	a.mu.Unlock()
	select {
	case a.changed <- struct{}{}:
	default:
	}
}

// list returns the set in order, at most maxAdoptable entries (the oldest
// requests of each partition first), and how many it left out.
func (a *adoptable) list() ([]events.StoredAt, int) {
	a.mu.Lock()
	out := make([]events.StoredAt, 0, len(a.set))
	for at := range a.set {
		out = append(out, at)
	}
	a.mu.Unlock()
	slices.SortFunc(out, func(x, y events.StoredAt) int {
		return cmp.Or(cmp.Compare(x.Partition, y.Partition), cmp.Compare(x.Seq, y.Seq))
	})
	if len(out) > maxAdoptable {
		return out[:maxAdoptable], len(out) - maxAdoptable
	}
	return out, 0
}

// list lists t while its runner runs, if it is meant to outlive
// its client; the returned func unlists it.
func (ad *adopter) list(t *Request) (unlist func()) {
	var at events.StoredAt
	t.f.view(func(p *projections.Request) {
		if p.Accepted.Background || p.Accepted.Resumable || ad.all {
			at = events.StoredAt{Partition: ad.parts.PartitionOf(t.id), Seq: p.AcceptedSeq()}
		}
	})
	if at.Seq == 0 {
		return func() {}
	}
	ad.listed.add(at)
	return func() { ad.listed.remove(at) }
}

// publish writes the list into this frontend's presence key each
// time it changes, at most every adoptableEvery, until ctx is done.
func (ad *adopter) publish(ctx context.Context) {
	var last time.Time
	warned := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-ad.listed.changed:
		}
		if !streams.Sleep(ctx, adoptableEvery-time.Since(last)) {
			return
		}
		last = time.Now()
		list, left := ad.listed.list()
		if left > 0 && !warned {
			warned = true
			ad.log.Warn("too many adoptable requests to list in the presence key: the rest are taken over only by a reader if this frontend dies",
				"listed", len(list), "left_out", left)
		}
		err := ad.presence.update(func(v *events.FrontendPresence) { v.Adoptable = list })
		if err != nil && ctx.Err() == nil && !errors.Is(err, streams.ErrSessionClosed) { // closed: deregistered, shutting down
			ad.log.Warn("list adoptable requests in the presence key", "err", err)
		}
	}
}

// watch watches the frontends until ctx is done, and adopts the
// listed requests of each one that departs (on g).
func (ad *adopter) watch(ctx context.Context, g *errgroup.Group) {
	handled := map[string]uint64{} // departed frontend → the revision of the list taken
	for {
		ch := ad.fleet.FrontendsChanged()
		live := ad.fleet.Frontends()
		alive := map[string]bool{}
		ids := make([]string, 0, len(live))
		for _, f := range live {
			alive[f.FrontendID] = true
			ids = append(ids, f.FrontendID)
		}
		known := ad.fleet.KnownFrontends()
		departed := map[string]bool{}
		for _, f := range known {
			departed[f.FrontendID] = !alive[f.FrontendID]
		}
		for id := range handled {
			if !departed[id] {
				delete(handled, id) // back (its next departure is a new one), or forgotten
			}
		}
		for _, f := range known {
			if alive[f.FrontendID] || f.FrontendID == ad.id || handled[f.FrontendID] == f.Revision {
				continue
			}
			handled[f.FrontendID] = f.Revision
			from, list := f.FrontendID, f.Adoptable
			g.Go(func() error {
				// A batched attempt followed here whose owner went before
				// it listed it, or whose list could not be read, is taken
				// over by a frontend that follows it: nothing but its
				// owner copies its end to the log (batched.go).
				ad.runtime.claimBatched(ctx, from)
				if len(list) > 0 {
					ad.adoptAll(ctx, from, list, ids)
				}
				if ad.all {
					ad.adoptBatched(ctx, from, ids)
				}
				return nil
			})
		}
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
	}
}

// earlierRun is the list that this frontend's id left in its presence key
// before this run registered: a run before this one, restarted within the
// presence TTL. Nobody else adopts its requests, since the key the others
// watch never went; this run takes them back (adoptEarlierRun). Called
// once the fleet view is loaded, before this run's key is written.
func (ad *adopter) earlierRun() []events.StoredAt {
	for _, f := range ad.fleet.KnownFrontends() {
		if f.FrontendID == ad.id {
			return f.Adoptable
		}
	}
	return nil
}

// adoptEarlierRun takes back the requests that an earlier run of this
// frontend's id listed (earlierRun) and left running: each is run here
// again, and migrated if its worker is gone too.
func (ad *adopter) adoptEarlierRun(ctx context.Context, list []events.StoredAt) {
	if len(list) == 0 {
		return
	}
	ad.log.Info("taking back the requests of an earlier run of this frontend id", "listed", len(list))
	var g errgroup.Group
	g.SetLimit(adoptParallel)
	for _, at := range list {
		g.Go(func() error {
			ad.adopt(ctx, at, ad.id)
			return nil
		})
	}
	_ = g.Wait()
}

// adoptAll adopts the requests of list (departed frontend from's) whose
// turn comes to this frontend, ranked among live, in order of rank.
func (ad *adopter) adoptAll(ctx context.Context, from string, list []events.StoredAt, live []string) {
	byRank := map[int][]events.StoredAt{}
	maxRank := 0
	for _, at := range list {
		r := adoptRank(at, ad.id, live)
		byRank[r] = append(byRank[r], at)
		maxRank = max(maxRank, r)
	}
	ad.log.Info("adopting the requests of a departed frontend", "frontend", from, "listed", len(list), "first_here", len(byRank[0]))
	start := time.Now()
	for r := 0; r <= maxRank; r++ {
		if len(byRank[r]) == 0 {
			continue
		}
		if !streams.Sleep(ctx, time.Until(start.Add(time.Duration(r)*adoptStagger))) {
			return
		}
		listed := ad.listedByLive()
		var g errgroup.Group
		g.SetLimit(adoptParallel)
		for _, at := range byRank[r] {
			if listed[at] {
				continue // adopted already by a frontend ranked before this one
			}
			g.Go(func() error {
				ad.adopt(ctx, at, from)
				return nil
			})
		}
		_ = g.Wait()
	}
}

// batchedLookBack is how far back the departed frontend's subjects in the
// workers' streams are read for its batched requests (adoptBatched): an
// attempt in flight sends a batch at least every stall timeout, and one
// that ended sent its end just before its owner would have copied it.
const batchedLookBack = time.Minute

// adoptBatched adopts the requests with a batched attempt that departed
// frontend from owned, listed or not: a request accepted in the moments
// before its frontend died, or whose list could not be written (NATS in
// transition), is in no list, and nothing but a frontend that follows it
// copies its end to the log. The index is the workers' streams: the
// batches sent to from in the last batchedLookBack name every such
// request. Each is adopted by the live frontend ranked first for its id.
func (ad *adopter) adoptBatched(ctx context.Context, from string, live []string) {
	outs, err := streams.WorkerOutputs(ctx, ad.js)
	if err != nil {
		ad.log.Warn("list workers' output streams for a departed frontend's requests", "frontend", from, "err", err)
		return
	}
	since := time.Now().Add(-batchedLookBack)
	ids := map[string]bool{}
	for _, o := range outs {
		for b, err := range streams.ReadWorkerOutput(ctx, ad.js, o.Worker, from, 0, since, 0) {
			if err != nil {
				break
			}
			for _, e := range b.Entries {
				ids[e.Subject] = true
			}
		}
	}
	for id := range ids {
		if streams.ValidRequestID(id) && rendezvousRank(id, ad.id, live) == 0 {
			ad.adoptID(ctx, id, from)
		}
	}
}

// adoptID adopts request id (adoptIf) if its current attempt is batched.
func (ad *adopter) adoptID(ctx context.Context, id, from string) {
	ad.adoptIf(ctx, id, from, func(p *projections.Request) bool {
		cur, _ := p.Current()
		return cur.Batched()
	})
}

// adoptRank is this frontend's (self's) place among live (which should
// include it) in the order in which frontends try to adopt the request
// stored at at: 0 tries first.
func adoptRank(at events.StoredAt, self string, live []string) int {
	return rendezvousRank(strconv.Itoa(at.Partition)+"/"+strconv.FormatUint(at.Seq, 10), self, live)
}

// rendezvousRank is self's place among live (which should include it) in
// the order of rendezvous hashing for key: every frontend that sees the
// same live set computes the same order, and a frontend's departure moves
// only the keys it ranked first. 0 is first.
func rendezvousRank(key, self string, live []string) int {
	score := func(id string) uint64 {
		h := fnv.New64a()
		_, _ = h.Write([]byte(id + "/" + key))
		return mix(h.Sum64())
	}
	mine, rank := score(self), 0
	for _, id := range live {
		if id == self {
			continue
		}
		if s := score(id); s > mine || (s == mine && id < self) {
			rank++
		}
	}
	return rank
}

// mix is splitmix64's finalizer: FNV alone barely changes its high bits
// for keys that differ in their last bytes.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// listedByLive is every request a live frontend lists as its own.
func (ad *adopter) listedByLive() map[events.StoredAt]bool {
	out := map[events.StoredAt]bool{}
	for _, f := range ad.fleet.Frontends() {
		for _, at := range f.Adoptable {
			out[at] = true
		}
	}
	return out
}

// adopt takes over the request whose accepted event is stored at at, listed
// by departed frontend from (this frontend's id: an earlier run of it), if
// it is meant to outlive its client or runs a batched attempt (adoptIf).
func (ad *adopter) adopt(ctx context.Context, at events.StoredAt, from string) {
	if at.Partition < 0 || at.Partition >= ad.parts.Count() {
		return
	}
	id, ok := ad.acceptedAt(ctx, at)
	if !ok {
		return
	}
	ad.adoptIf(ctx, id, from, func(p *projections.Request) bool {
		// A request that does not outlive its client is adopted only for
		// its batched attempt, which nothing else copies to the log.
		cur, _ := p.Current()
		return p.AcceptedSeq() == at.Seq && (p.Accepted.Background || p.Accepted.Resumable || cur.Batched())
	})
}

// adoptIf takes request id, departed frontend from's, over and runs it
// here with no reader, if its fold passes eligible, the log does not show
// its end (settled), and no live frontend but this one owns it.
func (ad *adopter) adoptIf(ctx context.Context, id, from string, eligible func(p *projections.Request) bool) {
	t, err := ad.runtime.Attach(ctx, id)
	if err != nil {
		ad.log.Warn("adopt request", "request_id", id, "from", from, "err", err)
		return
	}
	defer t.Release()
	var owner string
	ok := false
	t.View(func(p *projections.Request) { owner, ok = p.Owner, eligible(p) })
	if !ok || t.f.settled() || (owner != ad.id && ad.fleet.FrontendAlive(owner)) {
		return
	}
	was := owner
	t.requests.startDetachClock(t)
	ad.runtime.ensureOwner(ctx, t) // runs it here if it is this frontend's already
	t.View(func(p *projections.Request) { owner = p.Owner })
	if owner == ad.id && (was != ad.id || from == ad.id) {
		ad.adopted.Inc()
		ad.log.Info("adopted an orphaned request", "request_id", id, "from", from)
	}
}

// acceptedAt is the id of the request whose accepted event is stored at at,
// if that event is there (adopt checks what else it must be).
func (ad *adopter) acceptedAt(ctx context.Context, at events.StoredAt) (string, bool) {
	m, err := streams.MsgAt(ctx, ad.js, ad.parts.Stream(at.Partition), at.Seq)
	if err != nil {
		ad.log.Warn("read an adoptable request", "stream", ad.parts.Stream(at.Partition), "seq", at.Seq, "err", err)
		return "", false
	}
	if m == nil {
		return "", false // evicted, or expired
	}
	env, err := streams.DecodeRaw(m)
	if err != nil {
		return "", false
	}
	acc, ok := env.Event.(events.RequestAccepted)
	rs, perr := streams.ParseRequestSubject(m.Subject)
	if !ok || perr != nil || rs.Kind != "events" || rs.ID != acc.RequestID || ad.parts.PartitionOf(rs.ID) != at.Partition {
		return "", false
	}
	return acc.RequestID, true
}
