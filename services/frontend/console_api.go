package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/prometheus/client_golang/prometheus"
)

// consoleFrontend is a live frontend as the console lists it.
type consoleFrontend struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
	Host string `json:"host"`
	PID  int    `json:"pid"`
}

func consoleFrontends(fs []projections.Frontend) []consoleFrontend {
	out := make([]consoleFrontend, 0, len(fs))
	for _, f := range fs {
		out = append(out, consoleFrontend{ID: f.FrontendID, Addr: f.Addr, Host: f.Host, PID: f.PID})
	}
	return out
}

// consoleState is the data of a "state" event of GET /v1/console/events: the
// whole picture apart from the feed.
type consoleState struct {
	Now      time.Time            `json:"now"`
	Frontend string               `json:"frontend"`
	Workers  []projections.Worker `json:"workers"`
	// LostWorkers are the workers lost in the last Config.ConsoleLostWorkers
	// (state lost, with departed and reason), as this frontend saw them go.
	LostWorkers []projections.Worker         `json:"lost_workers"`
	Requests    []projections.RequestSummary `json:"requests"`
	Frontends   []consoleFrontend            `json:"frontends"`
}

func (fe *Frontend) consoleState() consoleState {
	now := time.Now()
	live := fe.fleet.Workers()
	return consoleState{Now: now, Frontend: fe.id, Requests: fe.console.requests("", "", consoleRows),
		Frontends: consoleFrontends(fe.fleet.Frontends()), Workers: live,
		LostWorkers: recentlyLost(fe.fleet.LostWorkers(), live, now.Add(-fe.cfg.ConsoleLostWorkers))}
}

// recentlyLost returns the lost workers that departed at or after since and
// are not live again (lost and live are read one after the other).
func recentlyLost(lost, live []projections.Worker, since time.Time) []projections.Worker {
	out := []projections.Worker{}
	for _, w := range lost {
		if w.Departed.Before(since) || slices.ContainsFunc(live, func(l projections.Worker) bool { return l.ID == w.ID }) {
			continue
		}
		out = append(out, w)
	}
	return out
}

// handleConsoleEvents serves GET /v1/console/events: server-sent events with
// the live feed of the log ("feed" events, resumable: each id is the feed
// cursor "R.W", the last BATON_REQUESTS and BATON_WORKERS sequences sent
// ("R0.R1.….W" with request partitions), and
// Last-Event-ID or ?last_event_id resumes after it on any replica) and the
// workers, requests and frontends ("state" events, without ids, at most four
// a second and at least every two seconds).
func (fe *Frontend) handleConsoleEvents(w http.ResponseWriter, r *http.Request) {
	cur, apiErr := lastEventCursor(r, fe.parts)
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	if err := fe.console.start(r.Context()); err != nil {
		writeError(w, http.StatusServiceUnavailable, "service_unavailable", "log_unavailable", err.Error())
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	timer := time.NewTimer(0)
	defer timer.Stop()
	var lastState time.Time
	stateDue := true
	for {
		feedCh, discCh, presCh := fe.console.changed.C(), fe.fleet.WorkersChanged(), fe.fleet.FrontendsChanged()
		for _, e := range fe.console.since(&cur) {
			if writeEvent(w, e.ID, "feed", e) != nil {
				return
			}
		}
		if wait := consoleStateRate - time.Since(lastState); stateDue && wait <= 0 {
			if writeEvent(w, "", "state", fe.consoleState()) != nil {
				return
			}
			lastState, stateDue = time.Now(), false
			timer.Reset(consoleStateIdle)
		} else if stateDue {
			timer.Reset(wait)
		}
		if rc.Flush() != nil {
			return
		}
		select {
		case <-feedCh:
			stateDue = true
		case <-discCh:
			stateDue = true
		case <-presCh:
			stateDue = true
		case <-timer.C:
			stateDue = true
		case <-r.Context().Done():
			return
		case <-fe.draining:
			return // end at once, so that the shutdown does not wait for consoles
		}
	}
}

// lastEventCursor is the feed cursor a console's events resume after:
// ?last_event_id, else the Last-Event-ID header, else the start.
func lastEventCursor(r *http.Request, parts streams.Partitions) (feedCursor, *apiError) {
	name, v := headerLastEventID, r.Header.Get(headerLastEventID)
	if q := r.URL.Query().Get("last_event_id"); q != "" {
		name, v = "last_event_id", q
	}
	if v == "" {
		return newCursor(parts), nil
	}
	cur, err := parseCursor(v, parts)
	if err != nil {
		return feedCursor{}, badRequest("invalid_last_event_id", "%s: %v", name, err)
	}
	return cur, nil
}

// writeEvent writes one server-sent event named event with v as JSON data,
// and with id unless it is empty.
func writeEvent(w io.Writer, id, event string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if id != "" {
		if _, err := fmt.Fprintf(w, "id: %s\n", id); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, data)
	return err
}

// handleConsoleRequests serves GET /v1/console/requests: the recent requests
// of the whole cluster, newest first, optionally ?model=, ?status= and ?limit=.
func (fe *Frontend) handleConsoleRequests(w http.ResponseWriter, r *http.Request) {
	writeResult(w, fe.consoleRequests(r))
}

func (fe *Frontend) consoleRequests(r *http.Request) result {
	q := r.URL.Query()
	status := q.Get("status")
	switch projections.Status(status) {
	case "", projections.StatusPending, projections.StatusRunning, projections.StatusCompleted,
		projections.StatusFailed, projections.StatusCancelled:
	default:
		return errResult(badRequest("invalid_status", "status must be one of pending, running, completed, failed, cancelled; got %q", status))
	}
	limit := fe.cfg.ConsoleRequests
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return errResult(badRequest("invalid_limit", "limit must be a positive whole number, got %q", v))
		}
		limit = n
	}
	if err := fe.console.start(r.Context()); err != nil {
		return errResult(&apiError{status: http.StatusServiceUnavailable, typ: "service_unavailable", code: "log_unavailable", message: err.Error()})
	}
	return okResult(map[string]any{"object": "list", "data": fe.console.requests(q.Get("model"), status, limit)})
}

// timelineDoc is the JSON of GET /v1/console/requests/{id}/timeline: the
// shape of `baton replay --json`.
type timelineDoc struct {
	Request  RequestState                `json:"request"`
	Timeline []projections.TimelineEntry `json:"timeline"`
	Output   string                      `json:"output"`
	// Tokens are the output's tokens when the request is compacted (its
	// deltas, which the timeline would show, are gone): the page colours
	// each by the attempt whose range holds it.
	Tokens []string `json:"tokens,omitempty"`
}

// handleTimeline serves GET /v1/console/requests/{id}/timeline: the request's
// whole history read from the log and folded as `baton replay` folds it.
func (fe *Frontend) handleTimeline(w http.ResponseWriter, r *http.Request) {
	writeResult(w, fe.timeline(r.Context(), r.PathValue("id")))
}

func (fe *Frontend) timeline(ctx context.Context, id string) result {
	if !streams.ValidID(id) {
		return errResult(notFound(id))
	}
	ctx, cancel := context.WithTimeout(ctx, 2*streams.DefaultTimeout)
	defer cancel()
	var envs []events.Envelope
	for e, err := range streams.ReadRequest(ctx, fe.js, fe.parts, id, 1) {
		if err != nil {
			return errResult(&lookupError{id: id, err: err})
		}
		envs = append(envs, e)
	}
	p, timeline, ok := projections.Replay(envs)
	if !ok {
		return errResult(notFound(id))
	}
	doc := timelineDoc{Request: stateOf(p), Timeline: timeline, Output: p.Text()}
	if p.Compacted() {
		doc.Tokens = p.Tokens(0)
	}
	return okResult(doc)
}

// handleFrontends serves GET /v1/console/frontends: the live frontends, from
// their presence keys, so a console can reconnect to another.
func (fe *Frontend) handleFrontends(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "self": fe.id, "data": consoleFrontends(fe.fleet.Frontends())})
}

// withCORS lets a console served by one frontend call the others (it fails
// over to them when its own dies): a request whose Origin is a live
// frontend's gets Access-Control-Allow-Origin, and its preflight is
// answered here; a frontend that died stays allowed, since its consoles are
// the ones that fail over. No other origin is allowed. Credentials are bearer keys the
// page sends itself, never cookies.
func (fe *Frontend) withCORS(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		if origin == "" || !fe.frontendOrigin(origin, r.Host) {
			h.ServeHTTP(w, r)
			return
		}
		hd := w.Header()
		hd.Set("Access-Control-Allow-Origin", origin)
		hd.Add("Vary", "Origin")
		hd.Set("Access-Control-Expose-Headers", "X-Request-Id, Retry-After")
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			hd.Set("Access-Control-Allow-Methods", "GET, POST")
			hd.Set("Access-Control-Allow-Headers", "Authorization, Content-Type, Last-Event-ID, X-Request-Id, X-Resumable, X-Parent-Request-Id, X-Worker-Id")
			hd.Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// frontendOrigin reports whether origin (scheme://host:port) is served by a
// frontend this replica has seen alive: its port is a frontend's, and its host is that frontend's
// listen host, or (for a frontend listening on every interface) its
// hostname, the host this request was sent to, or loopback when both are.
func (fe *Frontend) frontendOrigin(origin, reqHost string) bool {
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Port() == "" {
		return false
	}
	host, port := u.Hostname(), u.Port()
	self, _, _ := net.SplitHostPort(reqHost)
	if self == "" {
		self = reqHost
	}
	loopback := func(h string) bool {
		ip := net.ParseIP(h)
		return h == "localhost" || (ip != nil && ip.IsLoopback())
	}
	fronts := consoleFrontends(fe.fleet.KnownFrontends())
	if fe.listener != nil { // itself, before its own presence key comes back from the watch
		fronts = append(fronts, consoleFrontend{ID: fe.id, Addr: fe.listener.Addr().String()})
	}
	for _, f := range fronts {
		h, p, err := net.SplitHostPort(f.Addr)
		if err != nil || p != port {
			continue
		}
		ip := net.ParseIP(h)
		unspecified := h == "" || (ip != nil && ip.IsUnspecified())
		switch {
		case h == host:
			return true
		case unspecified && (host == self || host == f.Host || (loopback(host) && loopback(self))):
			return true
		}
	}
	return false
}

// clusterCollector exports what the frontend knows of the whole cluster, on
// each scrape: the discovery view's workers by model and state, and the size
// of the JetStream streams (read at most every clusterInfoTTL, so that
// scrapes stay cheap). nats-server's own monitoring endpoint is JSON, not
// Prometheus text, so the frontend exports these for it.
type clusterCollector struct {
	fe *Frontend

	mu      sync.Mutex
	fetched time.Time
	infos   map[string]streamSize
}

type streamSize struct{ msgs, bytes, consumers uint64 }

const clusterInfoTTL = 2 * time.Second

var (
	descWorkers = prometheus.NewDesc("baton_frontend_workers",
		"Workers in this frontend's discovery view, by model and state (ready, draining, not_ready).", []string{"model", "state"}, nil)
	descStreamMsgs = prometheus.NewDesc("baton_jetstream_stream_messages",
		"Messages stored in a baton JetStream stream.", []string{"stream"}, nil)
	descStreamBytes = prometheus.NewDesc("baton_jetstream_stream_bytes",
		"Bytes stored in a baton JetStream stream.", []string{"stream"}, nil)
	descStreamConsumers = prometheus.NewDesc("baton_jetstream_stream_consumers",
		"Consumers of a baton JetStream stream.", []string{"stream"}, nil)
)

func (c *clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descWorkers
	ch <- descStreamMsgs
	ch <- descStreamBytes
	ch <- descStreamConsumers
}

func (c *clusterCollector) Collect(ch chan<- prometheus.Metric) {
	type key struct{ model, state string }
	counts := map[key]int{}
	for _, w := range c.fe.fleet.Workers() {
		counts[key{w.Model, w.State}]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(descWorkers, prometheus.GaugeValue, float64(n), k.model, k.state)
	}
	for name, s := range c.streams() {
		ch <- prometheus.MustNewConstMetric(descStreamMsgs, prometheus.GaugeValue, float64(s.msgs), name)
		ch <- prometheus.MustNewConstMetric(descStreamBytes, prometheus.GaugeValue, float64(s.bytes), name)
		ch <- prometheus.MustNewConstMetric(descStreamConsumers, prometheus.GaugeValue, float64(s.consumers), name)
	}
}

// streams returns the streams' sizes, read again if older than clusterInfoTTL;
// a stream that cannot be read is left out.
func (c *clusterCollector) streams() map[string]streamSize {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.fetched) < clusterInfoTTL {
		return c.infos
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterInfoTTL)
	defer cancel()
	out := map[string]streamSize{}
	var errs []error
	for _, name := range append(c.fe.parts.Streams(), streams.WorkersStream) {
		s, err := c.fe.js.Stream(ctx, name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		info, err := s.Info(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[name] = streamSize{info.State.Msgs, info.State.Bytes, uint64(info.State.Consumers)}
	}
	c.infos, c.fetched = out, time.Now()
	if err := errors.Join(errs...); err != nil {
		c.fetched = time.Time{} // try again at the next scrape
	}
	return out
}
