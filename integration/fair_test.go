package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Fair admission across frontends by tenant weight, and within a tenant's
// share under another's flood (BenchmarkFairness runs the 60 s).

// fairClient sends completions as one tenant through one frontend, again
// and again, until its context ends, and records what each served.
type fairClient struct {
	url, key string
}

// served is one answered completion: when it ended and its tokens.
type served struct {
	at     time.Time
	tokens int
}

// once sends one completion of maxTokens (streamed or not) and returns
// its status, its completion tokens and its time to first token (the
// first data event of a stream; the whole answer otherwise).
func (c fairClient) once(ctx context.Context, prompt string, maxTokens int, stream bool) (status, tokens int, ttft time.Duration, err error) {
	body, _ := json.Marshal(map[string]any{"model": "mock", "prompt": prompt, "max_tokens": maxTokens, "stream": stream,
		"stream_options": map[string]any{"include_usage": true}})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.key)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !stream {
		data, err := io.ReadAll(resp.Body)
		ttft = time.Since(start)
		var out struct {
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if resp.StatusCode == http.StatusOK && err == nil {
			err = json.Unmarshal(data, &out)
		}
		return resp.StatusCode, out.Usage.CompletionTokens, ttft, err
	}
	rd := bufio.NewReader(resp.Body)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			return resp.StatusCode, tokens, ttft, fmt.Errorf("the stream ended without [DONE]: %w", err)
		}
		data, ok := strings.CutPrefix(strings.TrimSpace(line), "data: ")
		if !ok {
			continue
		}
		if ttft == 0 {
			ttft = time.Since(start)
		}
		if data == "[DONE]" {
			return resp.StatusCode, tokens, ttft, nil
		}
		var chunk struct {
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(data), &chunk) == nil && chunk.Usage != nil {
			tokens = chunk.Usage.CompletionTokens
		}
	}
}

// flood runs n clients of c sending completions of maxTokens until ctx
// ends, and returns what they were served (with its end times) and the
// count of each other status they got. A refused request is sent again
// after 20 ms (the client's pace, not a synchronisation).
func (c fairClient) flood(ctx context.Context, t testing.TB, n, maxTokens int) (func() ([]served, map[int]int), *sync.WaitGroup) {
	var mu sync.Mutex
	var got []served
	other := map[int]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			for k := 0; ctx.Err() == nil; k++ {
				status, tokens, _, err := c.once(ctx, fmt.Sprintf("%s client %d request %d", c.key[:5], i, k), maxTokens, false)
				if ctx.Err() != nil {
					return
				}
				mu.Lock()
				switch {
				case err != nil:
					t.Errorf("%s: %v", c.key[:5], err)
				case status == http.StatusOK:
					got = append(got, served{time.Now(), tokens})
				default:
					other[status]++
				}
				mu.Unlock()
				if status != http.StatusOK {
					select {
					case <-ctx.Done():
					case <-time.After(20 * time.Millisecond):
					}
				}
			}
		})
	}
	return func() ([]served, map[int]int) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got), maps.Clone(other)
	}, &wg
}

func tokensBetween(ss []served, from, to time.Time) int {
	n := 0
	for _, s := range ss {
		if !s.at.Before(from) && s.at.Before(to) {
			n += s.tokens
		}
	}
	return n
}

// fairStack starts the frontends (with the admission queue on) and the
// workers of the fairness tests: a pool of mock workers that are each busy
// from one running request on (--active-decode-blocks-threshold 0), so
// that the pool holds as many running requests as it has workers.
func fairStack(t testing.TB, frontends, workers int, budgets string, workerArgs ...string) (*stack, []*frontend) {
	s := newStack(t)
	keys, file := filepath.Join(s.dir, "keys"), filepath.Join(s.dir, "budgets")
	for path, data := range map[string]string{
		keys: strings.Join([]string{"alice " + aliceKey, "bob " + bobKey, "carol " + carolKey, "admin " + adminKey}, "\n") + "\n",
		file: budgets,
	} {
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var fs []*frontend
	for range frontends {
		fs = append(fs, s.frontend(nil, "--api-keys-file", keys, "--tenant-budgets-file", file,
			"--admission-queue", "32", "--admission-wait", "20s", "--active-decode-blocks-threshold", "0"))
	}
	var ids []string
	for i := range workers {
		id := fmt.Sprintf("w%d", i+1)
		s.worker(id, workerArgs...)
		ids = append(ids, id)
	}
	for _, f := range fs {
		waitRoutableAs(t, apiClient{f.url, adminKey}, ids...)
	}
	return s, fs
}

// fairCounters logs the frontends' fair-admission keys (vtc.<frontend> in
// baton_budgets): each tenant's service over its weight, lift and queue.
func fairCounters(t testing.TB, s *stack) {
	js := s.jetStream(t)
	kv, err := js.KeyValue(context.Background(), "baton_budgets")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range s.fronts {
		e, err := kv.Get(context.Background(), "vtc."+f.Name)
		if err != nil {
			t.Errorf("the fair-admission key of %s: %v", f.Name, err)
			continue
		}
		t.Logf("vtc.%s = %s", f.Name, e.Value())
	}
}

// TestFairAdmissionAcrossFrontends is the fairness target: alice
// (weight 4) sends only through frontend 1 and bob (weight 1) only through
// frontend 2, each with more clients than the whole pool (three workers,
// one request each at a time) can serve. The frontends hold the requests
// the pool cannot take in their queues and admit by the tenants' virtual
// token counters, which they share through the budgets bucket: over 20 s
// the tokens served come out 4:1 within 10%. (Without the shared counters
// each frontend admits whenever it sees a worker free: about 1:1.)
func TestFairAdmissionAcrossFrontends(t *testing.T) {
	ratio, _ := fairRatio(t, 20*time.Second)
	if math.Abs(ratio-4)/4 > 0.10 {
		t.Errorf("alice:bob = %.2f:1, want 4:1 within 10%%", ratio)
	}
}

// fairRatio runs the scenario of TestFairAdmissionAcrossFrontends for
// window and returns alice's tokens over bob's and the pool's tokens a
// second.
func fairRatio(t testing.TB, window time.Duration) (ratio, rate float64) {
	s, fs := fairStack(t, 2, 3, "alice weight=4\nbob weight=1\n", "--mock-tokens-per-sec", "200", "--mock-ttft", "10ms")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	alice, aw := fairClient{fs[0].url, aliceKey}.flood(ctx, t, 8, 20)
	bob, bw := fairClient{fs[1].url, bobKey}.flood(ctx, t, 8, 20)
	defer func() { cancel(); aw.Wait(); bw.Wait() }()
	waitFor(t, 20*time.Second, "both tenants served", func() bool {
		a, _ := alice()
		b, _ := bob()
		return len(a) >= 5 && len(b) >= 5
	})
	from := time.Now()
	<-time.After(window) // the measurement: both tenants keep sending throughout
	to := time.Now()
	cancel()
	aw.Wait()
	bw.Wait()
	a, aOther := alice()
	b, bOther := bob()
	at, bt := tokensBetween(a, from, to), tokensBetween(b, from, to)
	if bt == 0 {
		t.Fatalf("bob was served nothing in %v (alice %d tokens)", window, at)
	}
	ratio, rate = float64(at)/float64(bt), float64(at+bt)/to.Sub(from).Seconds()
	t.Logf("over %v: alice %d tokens, bob %d tokens: %.2f:1 (want 4:1); pool throughput %.0f tokens/s; other answers: alice %v, bob %v",
		to.Sub(from).Round(time.Millisecond), at, bt, ratio, rate, aOther, bOther)
	fairCounters(t, s)
	return ratio, rate
}

// TestFairAdmissionWithinShare: carol sends one request at a time, within
// her share of a pool of three workers (weights are equal: her share is
// half), while bob floods it with 15 clients, ten times his share. With the
// admission queue carol's requests are not refused and wait only for the
// next worker to free up ahead of bob's backlog: her p50 time to first
// token is within 1.5x of what she gets with the pool to herself. (The
// mock's 400 ms to first token is most of a request's time, as prefill of
// a long prompt is: a new request waits at most for the next of three
// running requests to end.) On two frontends, carol's and bob's, both
// admit on the same free worker now and then; the one it refuses busy waits
// for the next place (runner.Config.BusyWait) rather than answer 503, so
// carol's requests all succeed there too.
func TestFairAdmissionWithinShare(t *testing.T) {
	for _, frontends := range []int{1, 2} {
		t.Run(fmt.Sprintf("frontends=%d", frontends), func(t *testing.T) {
			alone, flooded := withinShare(t, frontends)
			if float64(flooded) > 1.5*float64(alone) {
				t.Errorf("carol's p50 time to first token during the flood %v, want within 1.5x of %v alone", flooded, alone)
			}
		})
	}
}

// BenchmarkFairness is TestFairAdmissionAcrossFrontends over the issue's
// 60 s (ratio: the tokens served, target 4:1 within 10%; Dynamo's
// per-process flow control: 163:162, and the pool's throughput), and
// TestFairAdmissionWithinShare's p50 time to first token during the flood
// over alone (within-share: target 1.5x at most), with carol and bob on
// one frontend and (within-share-2fe) each on its own.
func BenchmarkFairness(b *testing.B) {
	b.Run("ratio", func(b *testing.B) {
		for b.Loop() {
			ratio, rate := fairRatio(b, time.Minute)
			b.ReportMetric(ratio, "ratio_a:b")
			b.ReportMetric(rate, "tokens/s")
		}
	})
	for name, frontends := range map[string]int{"within-share": 1, "within-share-2fe": 2} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				alone, flooded := withinShare(b, frontends)
				b.ReportMetric(float64(flooded)/float64(alone), "ttft_flood/alone")
				b.ReportMetric(float64(alone.Microseconds())/1000, "ms_alone")
				b.ReportMetric(float64(flooded.Microseconds())/1000, "ms_flood")
			}
		})
	}
}

// withinShare runs TestFairAdmissionWithinShare's scenario and returns
// carol's p50 time to first token alone and during bob's flood: with one
// frontend both send through it; with two, carol through the first and
// bob through the second.
func withinShare(t testing.TB, frontends int) (alone, flooded time.Duration) {
	_, fs := fairStack(t, frontends, 3, "carol weight=1\nbob weight=1\n", "--mock-tokens-per-sec", "100", "--mock-ttft", "400ms")
	carol := fairClient{fs[0].url, carolKey}
	p50 := func(phase string) time.Duration {
		var ttfts []time.Duration
		for i := range 9 {
			status, tokens, ttft, err := carol.once(context.Background(), fmt.Sprintf("carol %s %d", phase, i), 5, true)
			if err != nil || status != http.StatusOK || tokens != 5 {
				t.Fatalf("carol %s %d: status %d, %d tokens, %v; want 200 with 5 tokens", phase, i, status, tokens, err)
			}
			ttfts = append(ttfts, ttft)
		}
		slices.Sort(ttfts)
		t.Logf("carol %s: time to first token %v", phase, ttfts)
		return ttfts[len(ttfts)/2]
	}
	alone = p50("alone")

	ctx, cancel := context.WithCancel(context.Background())
	bobs := fs[len(fs)-1]
	bob, bw := fairClient{bobs.url, bobKey}.flood(ctx, t, 15, 5)
	defer func() { cancel(); bw.Wait() }()
	// The pool is saturated once every worker runs one of bob's requests
	// and bob has more waiting in the queue than the pool holds.
	waitFor(t, 20*time.Second, "bob's flood to saturate the pool", func() bool {
		got, _ := bob()
		var out struct {
			Data []workerInfo `json:"data"`
		}
		r := apiClient{fs[0].url, adminKey}.get(t, "/v1/workers")
		if r.status != http.StatusOK || json.Unmarshal(r.body, &out) != nil {
			return false
		}
		busy := 0
		for _, w := range out.Data {
			if w.Load.ActiveRequests > 0 {
				busy++
			}
		}
		return busy == 3 && len(got) >= 6
	})
	flooded = p50("during the flood")
	got, other := bob()
	cancel()
	bw.Wait()
	t.Logf("within share, %d frontend(s): carol's p50 time to first token: %v alone, %v during bob's flood (%.2fx); bob served %d, other answers %v",
		frontends, alone, flooded, float64(flooded)/float64(alone), len(got), other)
	return alone, flooded
}
