package projections

import (
	"cmp"
	"slices"
	"time"

	"github.com/baton-dev/baton/events"
)

// DefaultRecentLimit is how many requests a Recent view keeps by default.
const DefaultRecentLimit = 500

// RequestSummary is one row of the console's request table.
type RequestSummary struct {
	ID           string    `json:"id"`
	Model        string    `json:"model"`
	Status       string    `json:"status"`
	Worker       string    `json:"worker,omitempty"`
	Owner        string    `json:"owner"`
	Tokens       int       `json:"tokens"`
	MaxTokens    int       `json:"max_tokens"`
	Attempts     int       `json:"attempts"`
	Migrations   int       `json:"migrations"`
	FinishReason string    `json:"finish_reason,omitempty"`
	ParentID     string    `json:"parent_id,omitempty"`
	Accepted     time.Time `json:"accepted"` // the accepted event's time
	Updated      time.Time `json:"updated"`  // the last applied event's time
	Seq          uint64    `json:"seq"`      // the last stream sequence folded (applied or not)
	// Approximate: some continuation of the request was not exact
	// (Request.Exact).
	Approximate bool `json:"approximate,omitempty"`
}

// Recent is the bounded view of the requests stream behind the console:
// every request whose accepted event it saw, folded exactly as a frontend
// folds one request (Request, without the token text), so any replica
// reading the same log shows the same rows. Beyond Limit requests it forgets the least recently updated
// ones, ended requests first. Events of requests whose accepted event it
// did not see (accepted before the reader started) are ignored.
//
// The request log may be split into partitions (streams.Partitions), each
// with its own sequences: Recent keeps the last applied one per partition.
//
// A Recent is not safe for concurrent use.
type Recent struct {
	limit   int
	lastSeq map[int]uint64 // per partition
	reqs    map[string]*recentRequest
}

type recentRequest struct {
	id       string
	r        *Request
	accepted time.Time
	updated  time.Time
}

// NewRecent returns an empty view that keeps at most limit requests
// (DefaultRecentLimit if limit <= 0).
func NewRecent(limit int) *Recent {
	if limit <= 0 {
		limit = DefaultRecentLimit
	}
	return &Recent{limit: limit, lastSeq: map[int]uint64{}, reqs: map[string]*recentRequest{}}
}

// Apply folds an event of a request log of one partition: ApplyPartition(0, e).
func (v *Recent) Apply(e events.Envelope) (changed bool) { return v.ApplyPartition(0, e) }

// ApplyPartition folds an event of request partition k and reports whether
// a row changed. Events not newer than the partition's last applied
// sequence are skipped.
func (v *Recent) ApplyPartition(k int, e events.Envelope) (changed bool) {
	if e.Seq != 0 {
		if e.Seq <= v.lastSeq[k] {
			return false
		}
		v.lastSeq[k] = e.Seq
	}
	id := requestOf(e.Event)
	if id == "" {
		id = e.Subject
	}
	if id == "" || e.Event == nil {
		return false
	}
	rr, ok := v.reqs[id]
	if !ok {
		if _, isAccepted := e.Event.(events.RequestAccepted); !isAccepted {
			return false
		}
		rr = &recentRequest{id: id, r: NewRequestCounter(), accepted: e.Time}
		v.reqs[id] = rr
		defer v.evict()
	}
	if !rr.r.Apply(e) {
		return false
	}
	rr.updated = e.Time
	return true
}

// evict forgets requests beyond the limit: ended ones first, then the least
// recently updated.
func (v *Recent) evict() {
	if len(v.reqs) <= v.limit {
		return
	}
	rows := make([]*recentRequest, 0, len(v.reqs))
	for _, rr := range v.reqs {
		rows = append(rows, rr)
	}
	slices.SortFunc(rows, func(a, b *recentRequest) int {
		if at, bt := a.r.Status.Terminal(), b.r.Status.Terminal(); at != bt {
			if at {
				return -1
			}
			return 1
		}
		return cmp.Or(a.updated.Compare(b.updated), a.accepted.Compare(b.accepted))
	})
	for _, rr := range rows[:len(rows)-v.limit] {
		delete(v.reqs, rr.id)
	}
}

// Len is the number of requests in the view.
func (v *Recent) Len() int { return len(v.reqs) }

// Requests returns the rows that match model and status (empty: any), newest
// accepted first, at most limit of them (all if limit <= 0).
func (v *Recent) Requests(model, status string, limit int) []RequestSummary {
	out := make([]RequestSummary, 0, len(v.reqs))
	for _, rr := range v.reqs {
		r := rr.r
		if (model != "" && r.Accepted.Model != model) || (status != "" && string(r.Status) != status) {
			continue
		}
		s := RequestSummary{
			ID: r.Accepted.RequestID, Model: r.Accepted.Model, Status: string(r.Status), Owner: r.Owner,
			Tokens: r.Len(), MaxTokens: r.Accepted.MaxTokens, Attempts: len(r.Attempts), Migrations: len(r.Migrations),
			FinishReason: r.FinishReason, ParentID: r.Accepted.ParentID,
			Accepted: rr.accepted, Updated: rr.updated, Seq: r.LastSeq(), Approximate: !r.Exact(),
		}
		if c, ok := r.Current(); ok {
			s.Worker = c.WorkerID
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b RequestSummary) int {
		return cmp.Or(b.Accepted.Compare(a.Accepted), cmp.Compare(b.ID, a.ID))
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}

// requestOf is the request id an event of the requests stream is about.
func requestOf(ev events.Event) string {
	if re, ok := ev.(events.RequestEvent); ok {
		return re.Request()
	}
	return ""
}

// InFeed reports whether an event belongs in the console's live feed of the
// log: the incidents people watch (migrations, fences and failed attempts,
// failures, cancellations, attaches, and every worker lifecycle event). The
// events every request has (accepted, routed, tokens, completed) stay out,
// so the feed grows with trouble, not with traffic.
func InFeed(ev events.Event) bool {
	switch ev.(type) {
	case events.AttemptFailed, events.RequestMigrated, events.RequestFailed, events.RequestCancelled,
		events.RequestAttached, events.WorkerRegistered, events.WorkerDraining, events.WorkerDeregistered,
		events.WorkerLost:
		return true
	}
	return false
}
