package frontend_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/waitfor"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/services/frontend"
	"github.com/baton-dev/baton/services/frontend/tenants"
)

// busyOnce waits until the one worker of url runs a request (its load
// report shows KV blocks in use: busy at a threshold of 0).
func busyOnce(t *testing.T, url string, busy bool) {
	t.Helper()
	waitfor.Poll(t, fmt.Sprintf("the worker busy=%v", busy), func() bool {
		resp, err := http.Get(url + "/v1/workers")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var out struct {
			Data []struct {
				Load struct {
					KVBlocksUsed int `json:"kv_blocks_used"`
				} `json:"load"`
			} `json:"data"`
		}
		return json.NewDecoder(resp.Body).Decode(&out) == nil && len(out.Data) == 1 && (out.Data[0].Load.KVBlocksUsed > 0) == busy
	})
}

// TestAdmissionQueueEdge: with --admission-queue 1 and the one worker busy
// (its request held at its first token until the test releases it), a
// request that waits longer than --admission-wait gets the busy 503 with
// Retry-After; of a tenant's next two, one waits in the queue and the
// other is refused with the busy 503 while the first still waits (the
// queue is full), and the one waiting is admitted and served once the
// worker frees up.
func TestAdmissionQueueEdge(t *testing.T) {
	zero := 0.0
	cfg := frontend.Config{Tenants: tenants.Config{AdmissionQueue: 1, AdmissionWait: 700 * time.Millisecond}}
	cfg.Fleet.ActiveDecodeBlocksThreshold = &zero
	held := func() *engine.Mock {
		eng, err := engine.NewMock(engine.MockConfig{TTFT: time.Millisecond, TokensPerSec: 1000, HoldAtToken: 1})
		if err != nil {
			t.Fatal(err)
		}
		return eng
	}
	eng := held()
	url := inProcessOn(t, eng, cfg)
	const slow = `{"model":"mock","prompt":"occupy","max_tokens":5}`
	const quick = `{"model":"mock","prompt":"queued","max_tokens":5}`

	type answer struct {
		status     int
		retryAfter string
		body       string
		took       time.Duration
	}
	send := func(body string) answer {
		start := time.Now()
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return answer{}
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return answer{resp.StatusCode, resp.Header.Get("Retry-After"), string(b), time.Since(start)}
	}
	isBusy := func(a answer) bool {
		return a.status == http.StatusServiceUnavailable && a.retryAfter != "" && strings.Contains(a.body, `"code":"all_workers_busy"`)
	}

	// Past the wait: the worker stays busy until released, the wait is 0.7 s.
	var wg sync.WaitGroup
	var first answer
	wg.Go(func() { first = send(slow) })
	busyOnce(t, url, true)
	if got := send(quick); !isBusy(got) || got.took < 600*time.Millisecond {
		t.Errorf("waiting past --admission-wait: got %d %q after %v, want the busy 503 with Retry-After after about 0.7 s", got.status, got.body, got.took)
	}
	eng.Release()
	wg.Wait()
	if first.status != http.StatusOK {
		t.Fatalf("the request that occupied the worker: %d %s", first.status, first.body)
	}

	// Within the wait: a longer one, and the queue of one is full.
	cfg.Tenants.AdmissionWait = time.Minute
	eng = held()
	url = inProcessOn(t, eng, cfg)
	wg.Go(func() { first = send(slow) })
	busyOnce(t, url, true)
	// Two more of the same tenant at once: one waits in the queue of one,
	// the other finds the queue full and is refused while the worker is
	// still held; the one waiting is served once it is released.
	answers := make(chan answer, 2)
	for range 2 {
		wg.Go(func() { answers <- send(quick) })
	}
	refused := <-answers
	eng.Release()
	served := <-answers
	wg.Wait()
	if first.status != http.StatusOK {
		t.Fatalf("the request that occupied the worker: %d %s", first.status, first.body)
	}
	if !isBusy(refused) || served.status != http.StatusOK {
		t.Errorf("got %d %q first and %d %q after the release; want the busy 503 while the worker was held, then one served",
			refused.status, refused.body, served.status, served.body)
	}
}
