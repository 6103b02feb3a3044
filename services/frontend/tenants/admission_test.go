package tenants

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/waitfor"
	"github.com/baton-dev/baton/services/fleet"
)

// pool is a fleet whose one worker is busy until the test frees it, for
// one request at a time.
type pool struct {
	mu      sync.Mutex
	free    int // requests the worker can take now
	changed chan struct{}
}

func (p *pool) Admit(model, pinned string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.free > 0 {
		return nil
	}
	return fleet.ErrAllBusy
}

func (p *pool) Free(model string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.free > 0
}

func (p *pool) WorkersChanged() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed
}

// add gives the worker room for n more requests, and says so.
func (p *pool) add(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free += n
	close(p.changed)
	p.changed = make(chan struct{})
}

// TestAdmissionByWeight: with the pool busy, two tenants of weights 3 and
// 1 queue four requests each; as the worker frees up one request at a
// time the queue admits them by their virtual token counters, three of the
// heavier tenant's for one of the other's in the first four, and every
// one in the end.
func TestAdmissionByWeight(t *testing.T) {
	file := filepath.Join(t.TempDir(), "budgets")
	if err := os.WriteFile(file, []byte("alice weight=3\nbob weight=1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &pool{changed: make(chan struct{})}
	g, err := New(Config{BudgetsFile: file, AdmissionQueue: 4, AdmissionWait: time.Minute}, Deps{ID: "fe-test", Fleet: p})
	if err != nil {
		t.Fatal(err)
	}
	if !g.Queues() {
		t.Fatal("the fair queue is off with --admission-queue 4")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go g.admission.run(ctx)

	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	for _, tenant := range []string{"alice", "bob"} {
		for range 4 {
			wg.Go(func() {
				tk, err := g.Admit(ctx, tenant, "mock", "completions", 100)
				if err != nil {
					t.Errorf("%s: %v", tenant, err)
					return
				}
				mu.Lock()
				order = append(order, tenant)
				mu.Unlock()
				p.mu.Lock()
				p.free-- // the admitted request takes the worker
				p.mu.Unlock()
				tk.Settle()
			})
		}
	}
	queued := func() int {
		g.admission.mu.Lock()
		defer g.admission.mu.Unlock()
		return len(g.admission.queues["alice"]) + len(g.admission.queues["bob"])
	}
	waitfor.Poll(t, "eight requests queued", func() bool { return queued() == 8 })
	for i := 1; i <= 8; i++ {
		p.add(1)
		waitfor.Poll(t, "one more admitted", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(order) == i
		})
	}
	wg.Wait()
	alice := 0
	for _, tenant := range order[:4] {
		if tenant == "alice" {
			alice++
		}
	}
	if alice != 3 {
		t.Errorf("the first four admitted: %v, want three of alice's (weight 3) for one of bob's", order[:4])
	}
	if n := g.series.snapshot("alice").Queued + g.series.snapshot("bob").Queued; n != 8 {
		t.Errorf("queued counted %d, want 8", n)
	}
}
