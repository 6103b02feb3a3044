package frontend

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/frontend/httpguard"
	"github.com/baton-dev/baton/services/frontend/openai"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/prometheus/client_golang/prometheus"
)

// snapshot is what a client stream needs from the projection at one moment.
type snapshot struct {
	openai.Choice // what the answer renders: tokens from the client's offset on, and how they ended
	acc           events.RequestAccepted
	worker        string // the worker of the current attempt
	status        projections.Status
	failure       *events.RequestFailed
	cancel        *events.RequestCancelled
}

// snapshotOf is t's snapshot from token offset from on.
func snapshotOf(t *runner.Request, from int) snapshot {
	var s snapshot
	t.View(func(p *projections.Request) {
		cur, _ := p.Current()
		s = snapshot{
			Choice: openai.Choice{
				Tokens: p.Tokens(from), Details: p.Details(from), FinishReason: p.FinishReason,
				Total: p.Len(), PromptTokens: p.PromptTokens(), Usage: p.CompletionTokens(), Exact: openai.ExactOf(p),
			},
			acc: p.Accepted, worker: cur.WorkerID, status: p.Status, failure: p.Failure, cancel: p.Cancel,
		}
		s.acc.Model = p.ResponseModel()
	})
	return s
}

// respond writes requests ts to the client (one request, or the choices of
// a group, each chunk carrying its choice index), streaming (SSE) or not,
// and reports whether it ended in success. acc names the response: the
// request itself, or the group's parent. from is a single request's resume
// offset (0 for a group). gone handles a client that left before the end.
//
// While it writes, every request counts a client (a request without clients
// is cancelled after the detach timeout), and if a request's owner goes away
// this frontend takes it over.
func (fe *Frontend) respond(w http.ResponseWriter, r *http.Request, acc events.RequestAccepted, ts []*runner.Request, from int, stream bool, start time.Time, gone func()) bool {
	wake := make(chan struct{}, 1) // poked by any request's change
	for _, t := range ts {
		t.Enter()
		defer t.Leave()
		defer t.Listen(wake)()
	}
	o := &output{fe: fe, w: w, r: r, acc: acc, ts: ts, wake: wake, gone: gone}
	setServerTiming(w, ts[0].Timing())
	if stream {
		return o.stream(from, start)
	}
	return o.unary()
}

// output is one response being written by respond.
type output struct {
	fe   *Frontend
	w    http.ResponseWriter
	r    *http.Request
	acc  events.RequestAccepted
	ts   []*runner.Request
	wake chan struct{}
	gone func()
}

// wait blocks until a request changes (true), claiming requests whose owner
// went away, or until the client left or the frontend cut open
// streams (false).
func (o *output) wait(pch <-chan struct{}) bool {
	select {
	case <-o.wake:
	case <-pch:
		for _, t := range o.ts {
			t.Claim()
		}
	case <-o.fe.closing:
		return false // cut by shutdown: the requests stay resumable
	case <-o.r.Context().Done():
		o.gone()
		return false
	}
	return true
}

func (o *output) unary() bool {
	for {
		pch := o.fe.fleet.FrontendsChanged()
		snaps := make([]snapshot, len(o.ts))
		done := true
		for i, t := range o.ts {
			snaps[i] = snapshotOf(t, 0)
			done = done && snaps[i].status.Terminal()
		}
		if done {
			for _, s := range snaps {
				if s.status != projections.StatusCompleted {
					return writeUnary(o.w, s)
				}
			}
			setWorker(o.w, snaps[len(snaps)-1])
			setServerTiming(o.w, o.ts[0].Timing()) // the upstream's time is known now
			acc := o.acc
			if m := snaps[0].acc.Model; m != "" {
				acc.Model = m // the model that answered (projections.Request.ResponseModel)
			}
			writeJSON(o.w, http.StatusOK, openai.Answer(acc, choicesOf(snaps)))
			return true
		}
		if !o.wait(pch) {
			return false
		}
	}
}

// writeUnary answers with s: its completion, or its failure.
func writeUnary(w http.ResponseWriter, s snapshot) bool {
	if s.status == projections.StatusCompleted {
		setWorker(w, s)
		writeJSON(w, http.StatusOK, openai.Answer(s.acc, []openai.Choice{s.Choice}))
		return true
	}
	status, body := failureOf(s)
	if status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, status, map[string]any{"error": body})
	return false
}

// choicesOf is the choices of snaps, one per request of a group.
func choicesOf(snaps []snapshot) []openai.Choice {
	cs := make([]openai.Choice, len(snaps))
	for i, s := range snaps {
		cs[i] = s.Choice
	}
	return cs
}

// failureOf is the HTTP status and OpenAI error body of a request that
// failed or was cancelled.
func failureOf(s snapshot) (int, map[string]any) {
	if s.status == projections.StatusCancelled {
		return 499, openai.ErrorBody("cancelled", "request_cancelled", "the request was cancelled ("+s.cancel.Reason+")")
	}
	return openai.FailureBody(s.failure)
}

// stream writes the requests as server-sent events, a single request from
// token offset from. Every event's id is the token offset after it (over all
// choices of a group, which is resumed per choice), so a client that
// reconnects with Last-Event-ID resumes exactly where it stopped. The stream
// ends with [DONE] only on success; a failure ends with an error event.
func (o *output) stream(from int, start time.Time) bool {
	if answered, ok := o.beforeHeaders(from); answered {
		return ok
	}
	w := httpguard.WithWriteDeadline(o.w, o.fe.cfg.WriteTimeout) // a client that stops reading is let go
	defer httpguard.EndWrites(w)
	flush := openai.StartSSE(w)
	sse := openai.NewSSE(w, o.acc)
	m := o.fe.metrics.tokens(o.acc.Model, start)
	if from == 0 {
		m.upstream = func() time.Duration { return o.ts[0].Timing().Upstream }
	}
	sent := make([]int, len(o.ts))
	sent[0] = from
	total := from
	started, finished := make([]bool, len(o.ts)), make([]bool, len(o.ts))
	marks := make([]openai.Choice, 0, len(o.ts)) // the choices' verdicts, for the usage chunk's mark
	for {
		pch := o.fe.fleet.FrontendsChanged()
		var failed *snapshot
		done, completion, prompt := true, 0, o.acc.PromptTokens
		marks = marks[:0]
		for i, t := range o.ts {
			s := snapshotOf(t, sent[i])
			marks = append(marks, openai.Choice{Exact: s.Exact})
			if i == 0 {
				sse.SetModel(s.acc.Model)
			}
			if n := len(s.Tokens); n > 0 {
				sent[i] += n
				total += n
				sse.Delta(total, i, s.Tokens, s.Details, !started[i])
				started[i] = true
				m.sent(n)
			}
			switch s.status {
			case projections.StatusCompleted:
				if !finished[i] {
					finished[i] = true
					sse.Finish(total, i, s.FinishReason, openai.Mark(s.Exact))
				}
			case projections.StatusFailed, projections.StatusCancelled:
				if failed == nil {
					failed = &s
				}
			}
			done = done && s.status.Terminal()
			completion += s.UsageTokens()
			if i == 0 && s.PromptTokens > 0 {
				prompt = s.PromptTokens // the engine's count
			}
		}
		if failed != nil {
			_, body := failureOf(*failed)
			sse.Error(total, body)
			if len(o.ts) > 1 {
				_ = o.fe.runtime.Cancel(o.r.Context(), o.acc.RequestID, events.CancelKill, "another choice failed", "")
			}
		} else if done {
			if o.acc.IncludeUsage {
				sse.Usage(total, map[string]any{
					"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
				}, openai.MarkOf(marks))
			}
			sse.Done(total)
		}
		flush()
		if failed != nil || done {
			m.end()
			return failed == nil
		}
		if sse.Err() != nil {
			o.gone()
			return false
		}
		if !o.wait(pch) {
			return false
		}
	}
}

// beforeHeaders settles what a single stream's headers depend on: it waits
// (boundedly) for the first token, answers a request that failed before any
// token as a plain error (answered; ok is what stream returns), and otherwise
// names the first token's worker, since SSE headers cannot change later.
func (o *output) beforeHeaders(from int) (answered, ok bool) {
	if len(o.ts) != 1 {
		return false, false
	}
	s := snapshotOf(o.ts[0], from)
	if from == 0 && s.Total == 0 && !s.status.Terminal() {
		s = o.awaitFirstToken()
	}
	if s.status == projections.StatusFailed && from == 0 && s.Total == 0 {
		// Nothing was streamed yet: answer as a plain error (e.g. 503 no
		// worker, or the model server's 400).
		return true, writeUnary(o.w, s)
	}
	if from > 0 || s.Total > 0 {
		// Headers that go out before the first token (after headerWait)
		// cannot name its worker: the one running now may never produce
		// it (a queue, a failure). GET /v1/requests/{id} names it later.
		setWorker(o.w, s)
	}
	return false, false
}

// tokenMetrics observes the tokens one response sends.
type tokenMetrics struct {
	metrics     *metrics
	model       string
	start, last time.Time
	// upstream, if set, is the engine's own time to first token as the
	// worker reported it (0: unknown): the first token then also observes
	// what baton added to it.
	upstream func() time.Duration
	// The series of the model, looked up at the first token rather than at
	// every one (a lookup hashes the labels under the vector's lock).
	itl prometheus.Observer
	out prometheus.Counter
}

func (m *metrics) tokens(model string, start time.Time) *tokenMetrics {
	return &tokenMetrics{metrics: m, model: model, start: start}
}

// sent observes n tokens sent now: time to first token, inter-token latency,
// output tokens.
func (m *tokenMetrics) sent(n int) {
	now := time.Now()
	if m.out == nil {
		m.itl, m.out = m.metrics.itl.WithLabelValues(m.model), m.metrics.outputTokens.WithLabelValues(m.model)
	}
	if m.last.IsZero() {
		ttft := now.Sub(m.start)
		m.metrics.ttft.WithLabelValues(m.model).Observe(ttft.Seconds())
		if m.upstream != nil {
			if up := m.upstream(); up > 0 {
				m.metrics.addedTTFT.WithLabelValues(m.model).Observe(max(ttft-up, 0).Seconds())
			}
		}
	} else {
		per := now.Sub(m.last).Seconds() / float64(n)
		for range n {
			m.itl.Observe(per)
		}
	}
	m.out.Add(float64(n))
	m.last = now
}

// end observes the response's duration.
func (m *tokenMetrics) end() {
	m.metrics.duration.WithLabelValues(m.model).Observe(time.Since(m.start).Seconds())
}

// setServerTiming says where the request's time went before its answer
// (the W3C Server-Timing header, which browsers' developer tools show):
// the accepted event's append to the log, routing and the first dispatch,
// and the upstream engine's own time to first token, each in milliseconds,
// as far as they are known when the headers go out (an SSE stream's go out
// once the first dispatch settled, before the engine's first token).
func setServerTiming(w http.ResponseWriter, t runner.Timing) {
	var parts []string
	for _, p := range []struct {
		name, desc string
		d          time.Duration
	}{{"log", "accepted appended to the log", t.Accepted}, {"dispatch", "routing and dispatch", t.Dispatched},
		{"upstream", "the engine's time to first token", t.Upstream}} {
		if p.d > 0 {
			parts = append(parts, fmt.Sprintf("%s;desc=%q;dur=%.3f", p.name, p.desc, float64(p.d.Microseconds())/1000))
		}
	}
	if len(parts) > 0 {
		w.Header().Set("Server-Timing", strings.Join(parts, ", "))
	}
}

// setWorker names the worker of s's current attempt in the X-Worker-Id
// response header.
func setWorker(w http.ResponseWriter, s snapshot) {
	if s.worker != "" {
		w.Header().Set(headerWorkerID, s.worker)
	}
}

// headerWait bounds how long a new stream's headers wait for its first
// token: a request that fails before it (the model server's 400, no worker
// left) still gets a real HTTP status rather than 200 and an error event.
const headerWait = 10 * time.Second

// awaitFirstToken waits, at most headerWait, until the single request of o
// has a token or has ended, and returns its state then. A client that left
// or a frontend that cuts streams ends the wait too; the stream then sees
// them as it would have.
func (o *output) awaitFirstToken() snapshot {
	deadline := time.NewTimer(headerWait)
	defer deadline.Stop()
	for {
		pch := o.fe.fleet.FrontendsChanged()
		s := snapshotOf(o.ts[0], 0)
		if s.Total > 0 || s.status.Terminal() {
			return s
		}
		select {
		case <-o.wake:
		case <-pch:
			o.ts[0].Claim()
		case <-deadline.C:
			return s
		case <-o.fe.closing:
			return s
		case <-o.r.Context().Done():
			return s
		}
	}
}
