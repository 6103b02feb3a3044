package quota

import (
	"math"
	"time"
)

// shape is a per-minute budget of limit as a token bucket: a burst of
// max(1, limit/10) whole units, refilled at (limit-burst+1)/60 per second.
// In any 60-second window [t, t+60s) a bucket admits at most its level at
// t (at most burst) plus what it refills in under 60 s (less than
// limit-burst+1): fewer than limit+1 units, so at most limit. The +1 is
// why the rate reaches limit exactly for limit 1: one a minute.
type shape struct {
	limit float64
	burst float64
	rate  float64 // per second
}

func shapeOf(limit int64) shape {
	if limit <= 0 {
		return shape{}
	}
	l := float64(limit)
	burst := math.Max(1, math.Floor(l/10))
	return shape{limit: l, burst: burst, rate: (l - burst + 1) / 60}
}

func (s shape) on() bool { return s.limit > 0 }

// chunk is the slice of the budget a frontend asks for at once, beyond
// what the request in hand needs: a quarter of the burst, so that two to
// four frontends can hold slices at once and none waits for another's
// lease to end.
func (s shape) chunk() float64 { return math.Max(1, math.Floor(s.burst/4)) }

// wait is how long until the bucket holds need more than it does.
func (s shape) wait(short float64) time.Duration {
	if short <= 0 {
		return 0
	}
	return time.Duration(short / s.rate * float64(time.Second))
}

// lease is a slice of a tenant's budget one frontend holds until Exp (unix
// nanoseconds, the holder's clock). While it lives it counts as spent;
// after, it is forgotten (spent, as far as anyone knows) unless the holder
// returned it.
type lease struct {
	Req float64 `json:"req,omitempty"`
	Tok float64 `json:"tok,omitempty"`
	Exp int64   `json:"exp"`
}

// state is the value of a tenant's key.
type state struct {
	At     int64            `json:"at"` // when Req and Tok were last refilled, unix nanoseconds
	Req    float64          `json:"req"`
	Tok    float64          `json:"tok"`
	Leases map[string]lease `json:"leases,omitempty"`
}

// fullState is the state of a key that does not exist: both buckets full.
func fullState(now time.Time, req, tok shape) state {
	return state{At: now.UnixNano(), Req: req.burst, Tok: tok.burst}
}

// refill brings s to now: leases that ended are forgotten, and each bucket
// gains its rate since At, up to its burst less what live leases hold
// (those of every frontend but self, whose lease the caller folds back).
func (s *state) refill(now time.Time, req, tok shape, self string) {
	var heldReq, heldTok float64
	for id, l := range s.Leases {
		if l.Exp <= now.UnixNano() {
			delete(s.Leases, id)
			continue
		}
		if id != self {
			heldReq += l.Req
			heldTok += l.Tok
		}
	}
	dt := math.Max(0, time.Duration(now.UnixNano()-s.At).Seconds())
	s.Req = math.Max(0, math.Min(req.burst-heldReq, s.Req+dt*req.rate))
	s.Tok = math.Max(0, math.Min(tok.burst-heldTok, s.Tok+dt*tok.rate))
	if now.UnixNano() > s.At {
		s.At = now.UnixNano()
	}
}
