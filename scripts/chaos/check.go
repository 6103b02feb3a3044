package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/vllmsim"
	"github.com/baton-dev/baton/migrations"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/streams"
)

// explained are the failure codes a request may end with under this soak's
// faults: the log says why (the migration limit ran out, or no worker was
// left to take it). Anything else is a violation.
var explained = map[string]bool{"migration_exhausted": true, "no_worker": true, "all_workers_busy": true}

// report is what the soak found.
type report struct {
	requests, completed, failed  int
	responses                    int // requests run as background responses
	failCodes                    map[string]int
	faults                       []fault
	logMigrations                int
	logMigrationsByType          map[string]int
	metricMigrations             float64 // sum over incarnations' last scrapes
	clientResumes, metricResumes int
	cuts, retries                int
	skippedDeltas                int // out-of-order deltas the fold skipped (superseded by re-sends)
	requestsWithSkips            int
	gaps                         []time.Duration
	incs                         []incReport
	violations                   []string

	unavail    int            // 503 answers clients got
	slowest    *outcome       // the request that took the largest share of its bound
	slowestOf  float64        // its time / its bound
	slowestMax time.Duration  // its bound
	overBound  []string       // requests that took longer than their bound
	churn      *churnStats    // -profile churn
	replayed   map[string]int // -profile upgrade: requests each release's replay agreed on
}

// requestBound is how long a request may take from its first try to its
// end: its tokens at the mock's rate plus 30 s.
func (h *harness) requestBound(o *outcome) time.Duration {
	return time.Duration(float64(o.maxTokens)/float64(h.cfg.tokensPerSec)*float64(time.Second)) + 30*time.Second
}

type incReport struct {
	id                                 string
	state                              string // live, killed
	logMig                             int
	metricMig                          float64
	clientRes, clientResTry, ambiguous int
	metricRes                          float64
	scraped                            bool
}

func (r *report) violate(format string, args ...any) {
	r.violations = append(r.violations, fmt.Sprintf(format, args...))
}

// check compares what every client received with the fault-free text and with
// the log, and every frontend incarnation's counters with the log.
func (h *harness) check(ctx context.Context, outs []*outcome, faults []fault) *report {
	r := &report{failCodes: map[string]int{}, logMigrationsByType: map[string]int{}, faults: faults}
	migByFE := map[string]int{}
	for _, o := range outs {
		r.requests++
		if o.input != "" {
			r.responses++
		}
		r.cuts += o.cuts
		r.retries += o.retries
		r.unavail += o.unavail
		if !o.ended.IsZero() {
			took, bound := o.ended.Sub(o.started), h.requestBound(o)
			if share := float64(took) / float64(bound); share > r.slowestOf {
				r.slowest, r.slowestOf, r.slowestMax = o, share, bound
			}
			if took > bound {
				r.overBound = append(r.overBound, fmt.Sprintf("%s took %v, bound %v", o.id, took.Round(time.Millisecond), bound))
			}
		}
		r.clientResumes += o.resumes
		want := h.expected(o.prompt, o.maxTokens)
		got := o.text.String()
		for _, p := range o.problems {
			r.violate("%s: %s", o.id, p)
		}
		if o.gaveUp != "" {
			r.violate("%s: client gave up: %s", o.id, o.gaveUp)
		}
		p, migs, err := readLog(ctx, h, o.id)
		if o.done && err == nil {
			p, migs = awaitCopiedEnd(ctx, h, o.id, p, migs)
		}
		if err != nil && o.gaveUp == "" && !(o.status == 503 && errorsIsNotFound(err)) {
			r.violate("%s: read the log: %v", o.id, err)
		}
		if p != nil && p.Skipped > 0 {
			// A delta stored after a later one whose append went through first
			// (an election in between); the worker's re-send covers it. Not a
			// loss: the text checks above and below decide.
			r.skippedDeltas += p.Skipped
			r.requestsWithSkips++
		}
		for _, m := range migs {
			if counted(m, migs) {
				migByFE[m.Frontend]++
			}
			r.logMigrations++
			r.logMigrationsByType[m.MigrationType]++
		}
		r.checkEnd(o, p, got, want)
	}
	for _, f := range faults {
		if f.err != "" {
			r.violate("%s of %s at %.1fs: the fault did not take effect or the stack did not recover: %s", f.kind, f.target, f.at.Seconds(), f.err)
		}
	}
	h.checkCounters(r, migByFE)
	return r
}

// checkEnd checks how o ended (got, where want is the fault-free text)
// against what the log says of it (p, nil when it could not be read).
func (r *report) checkEnd(o *outcome, p *projections.Request, got, want string) {
	switch {
	case o.done:
		r.completed++
		r.gaps = append(r.gaps, o.maxGap)
		if got != want {
			r.violate("%s: completed with text that differs from a fault-free run (%d tokens, want %d):\n    got  %q\n    want %q",
				o.id, len(strings.Fields(got)), o.maxTokens, clip(got), clip(want))
		}
		if p != nil && (p.Status != projections.StatusCompleted || p.Text() != want) {
			r.violate("%s: client saw a completion, the log says status %q, %d tokens, text equal: %v",
				o.id, p.Status, p.Len(), p.Text() == want)
		}
	case o.errEvent != "" || o.status != 0:
		r.failed++
		code := "?"
		if p != nil && p.Failure != nil {
			code = p.Failure.Code
		}
		r.failCodes[code]++
		if p == nil || p.Status != projections.StatusFailed || !explained[code] {
			status := "not in the log"
			if p != nil {
				status = string(p.Status)
			}
			r.violate("%s: ended with %d %s; the log says %s, code %q: not an explained failure", o.id, o.status, clip(o.errEvent), status, code)
		}
		if !strings.HasPrefix(want, got) {
			r.violate("%s: failed after %d tokens that are not a prefix of the fault-free text", o.id, len(strings.Fields(got)))
		}
	default:
		if o.gaveUp == "" {
			r.violate("%s: ended without [DONE] or an error", o.id)
		}
	}
}

func errorsIsNotFound(err error) bool {
	return err != nil && strings.Contains(err.Error(), streams.ErrNotFound.Error())
}

// readLog folds request id from the log and returns its migrated events.
func readLog(ctx context.Context, h *harness, id string) (*projections.Request, []events.RequestMigrated, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	p := projections.NewRequest()
	var migs []events.RequestMigrated
	for e, err := range streams.ReadRequest(ctx, h.js, h.parts(), id, 1) {
		if err != nil {
			return nil, nil, err
		}
		p.Apply(e)
		if m, ok := e.Event.(events.RequestMigrated); ok {
			migs = append(migs, m)
		}
	}
	return p, migs, nil
}

// copyPatience bounds how long the check waits for the owner of a request
// whose client saw it complete to copy a batched attempt's end to the
// request's partition: the client sees the end as the owner folds it from
// the worker's stream, and the copy follows at the owner's next step, or a
// second later when a NATS fault failed it (retryAfterError), so a read
// right after the load may come first.
const copyPatience = 10 * time.Second

// awaitCopiedEnd reads request id's log again until it shows the request
// ended, for at most copyPatience, when its last attempt is batched and
// p (the first read) shows it running; it returns the last read.
func awaitCopiedEnd(ctx context.Context, h *harness, id string, p *projections.Request, migs []events.RequestMigrated) (*projections.Request, []events.RequestMigrated) {
	deadline := time.Now().Add(copyPatience)
	for p != nil && !p.Status.Terminal() && time.Now().Before(deadline) {
		if cur, ok := p.Current(); !ok || !cur.Batched() {
			break
		}
		time.Sleep(200 * time.Millisecond)
		q, m, err := readLog(ctx, h, id)
		if err != nil {
			return p, migs // the last read's word stands
		}
		p, migs = q, m
	}
	return p, migs
}

// counted reports whether the migration_total metric counts migration m of
// a request whose migrations are migs: it counts a migration once a worker
// accepts its continuation (docs/fault-tolerance.md), so not one whose
// continuation attempt went unanswered and was migrated again from.
func counted(m events.RequestMigrated, migs []events.RequestMigrated) bool {
	for _, n := range migs {
		if n.FromAttempt == m.FromAttempt+1 && n.Reason == migrations.ReasonDispatchFailed {
			return false
		}
	}
	return true
}

// checkChurn holds the churn profile's bars: every request ended within its
// bound, errors and 503s stayed under 1% of requests, and the pool changed
// at least every 2 s.
func (h *harness) checkChurn(r *report) {
	if r.churn == nil {
		return
	}
	for _, v := range r.overBound {
		r.violate("request not ended in bounded time: %s", v)
	}
	if bad := r.failed + r.unavail; r.requests > 0 && float64(bad) >= 0.01*float64(r.requests) {
		r.violate("errors and 503s: %d failed + %d 503s of %d requests, want under 1%%", r.failed, r.unavail, r.requests)
	}
	if r.churn.longestGap > 2*time.Second {
		r.violate("the pool went %v without a change, want at most 2s", r.churn.longestGap.Round(time.Millisecond))
	}
}

// checkCounters compares each frontend incarnation's metrics with the log
// (migrations) and with its clients (resumes). A live incarnation's final
// scrape must match exactly. A killed one lost whatever it counted after its
// last scrape: its last scrape may be lower, never higher.
func (h *harness) checkCounters(r *report, migByFE map[string]int) {
	h.mu.Lock()
	incs := append([]*feInc(nil), h.allFE...)
	h.mu.Unlock()
	known := map[string]bool{}
	for _, f := range incs {
		f.mu.Lock()
		ir := incReport{id: f.id, state: "live", logMig: migByFE[f.id], metricMig: f.last.migrations,
			clientRes: f.resumes, clientResTry: f.resumeTry, ambiguous: f.ambiguous, metricRes: f.last.resumes, scraped: f.scraped}
		killed, final, termed := f.killed, f.finalScrap, f.termed
		f.mu.Unlock()
		known[f.id] = true
		r.metricMigrations += ir.metricMig
		r.metricResumes += int(ir.metricRes)
		if killed {
			ir.state = "killed"
			if termed {
				ir.state = "termed"
			}
			if ir.metricMig > float64(ir.logMig) {
				r.violate("%s (killed): metrics say %v migrations, the log %d", f.id, ir.metricMig, ir.logMig)
			}
			if ir.metricRes > float64(ir.clientResTry+ir.ambiguous) {
				r.violate("%s (killed): metrics say %v resumes, clients sent it %d (+%d re-posts)", f.id, ir.metricRes, ir.clientResTry, ir.ambiguous)
			}
		} else {
			if !final {
				r.violate("%s: no final metrics scrape", f.id)
			}
			if ir.metricMig != float64(ir.logMig) {
				r.violate("%s: metrics say %v migrations, the log %d", f.id, ir.metricMig, ir.logMig)
			}
			if ir.metricRes < float64(ir.clientRes) || ir.metricRes > float64(ir.clientRes+ir.ambiguous) {
				r.violate("%s: metrics say %v resumes, clients count %d (+%d ambiguous re-posts)", f.id, ir.metricRes, ir.clientRes, ir.ambiguous)
			}
		}
		r.incs = append(r.incs, ir)
	}
	for id, n := range migByFE {
		if !known[id] {
			r.violate("the log has %d migrations by %q, which this soak never started", n, id)
		}
	}
}

func clip(s string) string {
	if len(s) > 160 {
		return s[:80] + " … " + s[len(s)-80:]
	}
	return s
}

// print writes the summary table.
func (r *report) print(w io.Writer, cmdline string, elapsed time.Duration) {
	fmt.Fprintf(w, "\nchaos soak: %s (%v)\n\n", cmdline, elapsed.Round(time.Second))
	row := func(k, v string) { fmt.Fprintf(w, "| %-34s | %-60s |\n", k, v) }
	fmt.Fprintf(w, "| %-34s | %-60s |\n|%s|%s|\n", "what", "count", strings.Repeat("-", 36), strings.Repeat("-", 62))
	row("requests", fmt.Sprint(r.requests))
	row("of which background responses", fmt.Sprint(r.responses))
	row("completed, text identical", fmt.Sprint(r.completed))
	var codes []string
	for c, n := range r.failCodes {
		codes = append(codes, fmt.Sprintf("%s %d", c, n))
	}
	sort.Strings(codes)
	row("failed (code: count)", fmt.Sprintf("%d %s", r.failed, strings.Join(codes, ", ")))
	byKind, checked := map[string]int{}, map[string]int{}
	recovery := map[string]time.Duration{}
	var kinds []string
	for _, f := range r.faults {
		if byKind[f.kind] == 0 {
			kinds = append(kinds, f.kind)
		}
		byKind[f.kind]++
		if f.err == "" {
			checked[f.kind]++
		}
		recovery[f.kind] = max(recovery[f.kind], f.recover)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		row("faults: "+k, fmt.Sprintf("%d, %d verified in effect (slowest recovery %v)", byKind[k], checked[k], recovery[k].Round(100*time.Millisecond)))
	}
	var types []string
	for t, n := range r.logMigrationsByType {
		types = append(types, fmt.Sprintf("%s %d", t, n))
	}
	sort.Strings(types)
	row("migrations: log (by type)", fmt.Sprintf("%d (%s)", r.logMigrations, strings.Join(types, ", ")))
	row("migrations: metrics (last scrapes)", fmt.Sprint(r.metricMigrations))
	row("resumes: clients", fmt.Sprint(r.clientResumes))
	row("resumes: metrics (last scrapes)", fmt.Sprint(r.metricResumes))
	row("streams cut (client resumed)", fmt.Sprint(r.cuts))
	row("retries before acceptance", fmt.Sprint(r.retries))
	row("503 answers", fmt.Sprint(r.unavail))
	if r.slowest != nil {
		o := r.slowest
		row("slowest request / its bound", fmt.Sprintf("%v / %v (%s, %d tokens)", o.ended.Sub(o.started).Round(time.Millisecond),
			r.slowestMax, o.id, o.maxTokens))
	}
	if r.replayed != nil {
		row("replayed by each release, agreeing", fmt.Sprintf("previous %d, current %d", r.replayed["previous"], r.replayed["current"]))
	}
	if c := r.churn; c != nil {
		row("churn: pool changes", fmt.Sprintf("%d (%d adds, %d removes, %d frontends replaced)", c.changes, c.adds, c.removes, c.frontendsReplaced))
		row("churn: live workers min / max", fmt.Sprintf("%d / %d", c.minPool, c.maxPool))
		row("churn: longest gap between changes", c.longestGap.Round(time.Millisecond).String())
		row("churn: slowest recovery", fmt.Sprintf("%v (%s of %s at %.1fs)", c.slowest.recover.Round(time.Millisecond), c.slowest.kind, c.slowest.target, c.slowest.at.Seconds()))
	}
	row("out-of-order deltas in the log", fmt.Sprintf("%d in %d requests (re-sent after an election; no text lost)", r.skippedDeltas, r.requestsWithSkips))
	slices.Sort(r.gaps)
	row("stall p50 / p99 / max", fmt.Sprintf("%v / %v / %v", pct(r.gaps, 0.50), pct(r.gaps, 0.99), pct(r.gaps, 1)))
	fmt.Fprintln(w)
	r.printFrontends(w)
	fmt.Fprintln(w)
	r.printViolations(w)
}

// printFrontends writes the table of frontend incarnations.
func (r *report) printFrontends(w io.Writer) {
	fmt.Fprintf(w, "| %-8s | %-6s | %-13s | %-13s | %-22s |\n", "frontend", "state", "migr log/metr", "resumes c/m", "note")
	for _, i := range r.incs {
		note := ""
		switch i.state {
		case "killed":
			note = fmt.Sprintf("lost by kill -9: %d mig", i.logMig-int(i.metricMig))
		case "termed":
			note = fmt.Sprintf("after last scrape: %d mig", i.logMig-int(i.metricMig))
		}
		if i.ambiguous > 0 {
			note += fmt.Sprintf(" %d ambiguous", i.ambiguous)
		}
		fmt.Fprintf(w, "| %-8s | %-6s | %13s | %13s | %-22s |\n", i.id, i.state,
			fmt.Sprintf("%d / %v", i.logMig, i.metricMig), fmt.Sprintf("%d / %v", i.clientRes, i.metricRes), note)
	}
}

// printViolations writes the violations, the first 50 of them.
func (r *report) printViolations(w io.Writer) {
	if len(r.violations) == 0 {
		fmt.Fprintln(w, "no violations")
		return
	}
	fmt.Fprintf(w, "%d violations:\n", len(r.violations))
	for i, v := range r.violations {
		if i == 50 {
			fmt.Fprintf(w, "  … and %d more\n", len(r.violations)-50)
			break
		}
		fmt.Fprintln(w, "  - "+v)
	}
}

// pct is the q-quantile of sorted durations (nearest rank).
func pct(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	i = max(0, min(i, len(sorted)-1))
	return sorted[i].Round(time.Millisecond)
}

func engineText(prompt string, maxTokens int) string { return engine.MockText(prompt, 0, maxTokens) }

// expected is the fault-free answer to prompt: the mock's, or the greedy
// simulator's with -engine openai.
func (h *harness) expected(prompt string, maxTokens int) string {
	if h.cfg.engine == "openai" {
		return vllmsim.GreedyCompletion(prompt, maxTokens)
	}
	return engineText(prompt, maxTokens)
}
