package tenants

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/frontend/apikeys"
	"github.com/baton-dev/baton/services/frontend/openai"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/services/quota"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// Config configures a frontend's tenants: their limits on this frontend,
// their budgets across every frontend and fair admission. The edge's
// Config holds it whole (frontend.Config.Tenants) and cmd/baton's flags
// bind into it; New applies its defaults.
type Config struct {
	// MaxConcurrent caps one tenant's open completions, resumes and
	// responses on this frontend (--tenant-max-concurrent, 429 beyond); 0
	// or negative: no cap (the edge's default, a quarter of its
	// connections when there are API keys, is set before New). A tenant's
	// concurrent=N in the budgets file replaces it, as one cap across
	// every frontend.
	MaxConcurrent int
	// RPS caps one tenant's API requests per second on this frontend
	// (--tenant-rps, 429 beyond), with a burst of max(1, RPS); 0: unlimited.
	RPS float64
	// BudgetsFile, if set, holds per-tenant budgets (--tenant-budgets-file,
	// lines "TENANT [rpm=N] [tpm=N] [concurrent=N] [log=F] [weight=W]",
	// quota.Parse): rpm, tpm and concurrent are one budget across every
	// frontend, kept in the budgets bucket. Reloaded by Gate.Reload.
	BudgetsFile string
	// RPM and TPM are the per-minute budgets of a tenant without a line,
	// or without that field (--tenant-rpm, --tenant-tpm); 0: none. Either
	// set, or a budgets file, turns the shared budgets on.
	RPM, TPM int64
	// Lease is how long a frontend holds a slice of a tenant's budget
	// before it returns what is left (quota.Config.Lease); default 2s.
	Lease time.Duration
	// AdmissionQueue, if above 0, turns on weighted fair admission
	// (--admission-queue): a new request that finds every worker busy
	// waits, in a queue of at most this many requests per tenant, for at
	// most AdmissionWait (--admission-wait, default DefaultAdmissionWait),
	// and the frontends admit the queued tenants by weight as workers free
	// up. 0 (the default): a busy pool answers 503 at once.
	AdmissionQueue int
	AdmissionWait  time.Duration
}

// withDefaults applies Config's defaults (the budgets' lease is quota's).
func (c Config) withDefaults() Config {
	if c.AdmissionQueue > 0 && c.AdmissionWait == 0 {
		c.AdmissionWait = DefaultAdmissionWait
	}
	return c
}

// Validate reports every problem with c.
func (c Config) Validate() error {
	var errs []error
	if c.RPS < 0 || c.RPM < 0 || c.TPM < 0 || c.Lease < 0 {
		errs = append(errs, errors.New("tenant limits must not be negative"))
	}
	if c.AdmissionQueue < 0 || c.AdmissionWait < 0 {
		errs = append(errs, errors.New("the admission queue and its wait must not be negative"))
	}
	return errors.Join(errs...)
}

// sharedBudgets reports whether the frontend keeps shared budgets: a
// budgets file, or a default per-minute budget. Without either it sends
// nothing to the budgets bucket.
func (c Config) sharedBudgets() bool {
	return c.BudgetsFile != "" || c.RPM > 0 || c.TPM > 0
}

// load reads the budgets file (if any) with the defaults of c.
func (c Config) load() (quota.Budgets, error) {
	b := quota.Budgets{Default: quota.Budget{RPM: c.RPM, TPM: c.TPM}}
	if c.BudgetsFile == "" {
		return b, nil
	}
	t, err := readBudgets(c.BudgetsFile)
	b.Tenants = t
	return b, err
}

// Deps is what the gate reads of the frontend it guards: its id, the
// request runtime, the fleet view, the keys (nil: the API is open) and its
// drain (draining is closed when it starts to shut down).
type Deps struct {
	ID       string
	Log      *slog.Logger
	JS       jetstream.JetStream
	Runtime  *runner.Runner
	Fleet    Pool
	Keys     *apikeys.Keyring
	Draining <-chan struct{}
}

// Pool is what the fair queue asks of the fleet view (fleet.Fleet).
type Pool interface {
	// Admit is fleet.Fleet.Admit: nil, or why no worker takes a request
	// for model now (fleet.ErrAllBusy when every one is busy).
	Admit(model, pinned string) error
	// Free reports whether a worker of model could take a new request now.
	Free(model string) bool
	// WorkersChanged is closed at the next change of the workers.
	WorkersChanged() <-chan struct{}
}

// Gate holds a frontend's tenants to their limits and budgets. It is safe
// for concurrent use. Create it with New, and start it with Start once the
// runtime runs.
type Gate struct {
	Deps
	cfg    Config
	limits *limits
	// admission is the fair queue (nil: off, a busy pool answers 503 at once).
	admission *admission
	series    *series // per-tenant series, served by MetricsHandler (the admin's)

	mu      sync.Mutex     // guards budgets and quota against a reload
	budgets quota.Budgets  // the budgets file's and the defaults; replaced by Reload
	quota   *quota.Limiter // nil without shared budgets; set by Start
	ledger  *logLedger     // tenants' bytes in the log (log=F); nil without a budgets file; set by Start
	slots   *quota.Slots   // concurrent=N across every frontend; nil without a budgets file; set by Start
}

// New reads the budgets file (an error for a bad one) and builds the gate.
func New(cfg Config, d Deps) (*Gate, error) {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	cfg = cfg.withDefaults()
	g := &Gate{Deps: d, cfg: cfg, limits: newLimits(cfg.MaxConcurrent, cfg.RPS)}
	var err error
	if g.budgets, err = cfg.load(); err != nil {
		return nil, err
	}
	g.limits.setPerTenant(concurrentOf(g.budgets))
	if g.series, err = newSeries(); err != nil {
		return nil, fmt.Errorf("tenant metrics: %w", err)
	}
	if cfg.AdmissionQueue > 0 {
		g.admission = newAdmission(g, cfg.AdmissionQueue, cfg.AdmissionWait)
	}
	return g, nil
}

// Start opens the budgets bucket (provisioned with the log) for the shared
// budgets, the log shares and the fair queue, those that are configured;
// the edge calls it once the runtime started and runs the returned
// function (nil: nothing to run) until the end of its shutdown, when it
// returns its leases and deletes its keys.
func (g *Gate) Start(ctx context.Context) (run func(context.Context), err error) {
	runBudgets, err := g.startBudgets(ctx)
	if err != nil {
		return nil, err
	}
	runShares, err := g.startLogShares(ctx)
	if err != nil {
		return nil, err
	}
	runSlots, err := g.startSlots(ctx)
	if err != nil {
		return nil, err
	}
	runAdmission, err := g.startAdmission(ctx)
	if err != nil {
		return nil, fmt.Errorf("admission: %w", err)
	}
	parts := []struct {
		run  func(context.Context) error
		lost string
	}{
		{runBudgets, "tenant budgets: the other frontends' budgets are not compared"},
		{runShares, "tenant log shares: the other frontends' counts are not read"},
		{runSlots, "tenant concurrent slots: this frontend's are not renewed"},
		{runAdmission, "fair admission: the other frontends' counters are not seen: tenants are admitted by weight on this frontend alone"},
	}
	return func(ctx context.Context) {
		var wg sync.WaitGroup
		for _, p := range parts {
			if p.run == nil {
				continue
			}
			wg.Go(func() {
				if err := p.run(ctx); err != nil {
					g.Log.Error(p.lost, "err", err)
				}
			})
		}
		wg.Wait()
	}, nil
}

// bucket opens the budgets bucket, which the runtime provisioned with the log.
func (g *Gate) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := g.JS.KeyValue(ctx, streams.BudgetsBucket)
	if err != nil {
		return nil, fmt.Errorf("budgets bucket %s: %w", streams.BudgetsBucket, err)
	}
	return kv, nil
}

// Reload reads the budgets file again (on SIGHUP). On an error the budgets
// in use stay and the error is returned; without a file it does nothing.
func (g *Gate) Reload() error {
	if g.cfg.BudgetsFile == "" {
		return nil
	}
	b, err := g.cfg.load()
	if err != nil {
		return err
	}
	g.limits.setPerTenant(concurrentOf(b))
	g.mu.Lock()
	g.budgets = b
	if g.quota != nil {
		g.quota.SetBudgets(b)
	}
	g.mu.Unlock()
	g.Log.Info("tenant budgets reloaded", "tenants", len(b.Tenants), "budgets_hash", b.Hash())
	return nil
}

// budget is tenant's budget as the file in use says.
func (g *Gate) budget(tenant string) quota.Budget {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.budgets.For(tenant)
}

// allBudgets is the budgets in use.
func (g *Gate) allBudgets() quota.Budgets {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.budgets
}

// HealthNote adds to a /health body the frontends whose budgets differ
// from this one's, when some do.
func (g *Gate) HealthNote(body map[string]any) map[string]any {
	if g.quota != nil {
		if d := g.quota.Differ(); len(d) > 0 {
			body["budgets_differ"] = map[string]any{"budgets_hash": g.quota.Hash(), "frontends": d}
		}
	}
	return body
}

// Refusal is a request a tenant's limit, budget or the fair queue refused,
// answered in OpenAI's error shape with Retry-After.
type Refusal struct {
	Status     int
	Type, Code string
	Message    string
	RetryAfter time.Duration // at least a second is said
}

func (e *Refusal) Error() string { return e.Message }

// Write answers e.
func (e *Refusal) Write(w http.ResponseWriter) {
	w.Header().Set("Retry-After", RetryAfter(e.RetryAfter))
	openai.WriteError(w, e.Status, e.Type, e.Code, e.Message)
}

// RetryAfter is the Retry-After header's whole seconds for a wait, at least 1.
func RetryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))
}

// tokensUsed is what requests ids used, prompt and completion, and whether
// every one of them ended (false too when one cannot be read). With
// skipUnknown an id the log does not know (never accepted) used nothing.
func (g *Gate) tokensUsed(ids []string, skipUnknown bool) (used int64, ended bool) {
	ctx, cancel := context.WithTimeout(context.Background(), streams.DefaultTimeout)
	defer cancel()
	for _, id := range ids {
		t, err := g.Runtime.Attach(ctx, id)
		if skipUnknown && errors.Is(err, streams.ErrNotFound) {
			continue
		}
		if err != nil {
			return used, false
		}
		var done bool
		t.View(func(p *projections.Request) {
			done = p.Status.Terminal()
			used += int64(p.PromptTokens() + p.CompletionTokens())
		})
		t.Release()
		if !done {
			return used, false
		}
	}
	return used, true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers as the edge does: a 503 says Retry-After 1.
func writeError(w http.ResponseWriter, status int, typ, code, message string) {
	if status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", "1")
	}
	openai.WriteError(w, status, typ, code, message)
}
