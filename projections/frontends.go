package projections

import (
	"encoding/json"
	"sort"

	"github.com/baton-dev/baton/events"
)

// Frontend is one live frontend replica as its presence key shows it.
type Frontend struct {
	events.FrontendPresence
	Revision uint64 // of its key: a conditional delete expects it
}

// FrontendUpdate is one change of the frontends bucket: a put of key (Value
// holds the JSON of events.FrontendPresence) or, with Deleted, its deletion
// or expiry.
type FrontendUpdate struct {
	Key      string
	Revision uint64
	Deleted  bool
	Value    []byte
}

// Frontends is the membership of frontend replicas, folded from the
// frontends bucket: a request whose owner is not a member may be taken over
// (by a frontend) or cancelled after the detach timeout (by its worker).
//
// Frontends is not safe for concurrent use.
type Frontends struct {
	alive map[string]Frontend
	gone  map[string]Frontend // departed members, at most departedLimit
}

// departedLimit bounds how many departed frontends a view remembers.
const departedLimit = 64

// NewFrontends returns an empty membership.
func NewFrontends() *Frontends { return &Frontends{alive: map[string]Frontend{}} }

// Apply folds u and reports whether membership changed (a renewal of a live
// key changes nothing). A put whose value is not a presence counts as gone.
func (v *Frontends) Apply(u FrontendUpdate) (changed bool) {
	_, was := v.alive[u.Key]
	var p events.FrontendPresence
	is := !u.Deleted && json.Unmarshal(u.Value, &p) == nil
	if is {
		p.FrontendID = u.Key
		v.alive[u.Key] = Frontend{FrontendPresence: p, Revision: u.Revision}
	} else {
		if f, ok := v.alive[u.Key]; ok {
			if v.gone == nil || len(v.gone) >= departedLimit {
				v.gone = map[string]Frontend{}
			}
			v.gone[u.Key] = f
		}
		delete(v.alive, u.Key)
	}
	return was != is
}

// Members returns copies of the live frontends, sorted by id.
func (v *Frontends) Members() []Frontend {
	out := make([]Frontend, 0, len(v.alive))
	for _, f := range v.alive {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].FrontendID < out[j].FrontendID })
	return out
}

// Departed returns copies of frontends that were members and are gone (the
// most recent ones; the view forgets them in batches past 64), sorted by id.
func (v *Frontends) Departed() []Frontend {
	out := make([]Frontend, 0, len(v.gone))
	for id, f := range v.gone {
		if _, back := v.alive[id]; !back {
			out = append(out, f)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].FrontendID < out[j].FrontendID })
	return out
}

// Alive reports whether frontend id holds a live key.
func (v *Frontends) Alive(id string) bool {
	_, ok := v.alive[id]
	return ok
}

// ConnectedAs returns the live frontends whose NATS connection is client id
// on server, sorted by id.
func (v *Frontends) ConnectedAs(client uint64, server string) []Frontend {
	var out []Frontend
	for _, f := range v.alive {
		if f.ClientID == client && f.Server == server {
			out = append(out, f)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].FrontendID < out[j].FrontendID })
	return out
}
