package integration

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The Grafana dashboard (docs/grafana/): every PromQL expression of it
// parses and returns data, from a real prometheus scraping a stack under
// traffic of every kind.

// dashboardExprs returns every PromQL expression of the Grafana dashboard,
// by panel title, with Grafana's variables replaced as Grafana would for
// "all models" and a 1-minute rate interval.
func dashboardExprs(t *testing.T, path string) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	out := map[string][]string{}
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			e := strings.NewReplacer(`$model`, `.*`, `$__rate_interval`, `1m`).Replace(tg.Expr)
			if strings.Contains(e, "$") {
				t.Errorf("panel %q: unknown variable in %q", p.Title, tg.Expr)
			}
			out[p.Title] = append(out[p.Title], e)
		}
	}
	return out
}

// promQuery runs an instant query; it returns the values of the result's
// samples, or the error Prometheus gave (a parse error, for one).
func promQuery(promURL, expr string) ([]float64, error) {
	resp, err := http.Get(promURL + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s", r.Error)
	}
	var out []float64
	for _, s := range r.Data.Result {
		str, _ := s.Value[1].(string)
		v, err := strconv.ParseFloat(str, 64)
		if err != nil {
			return nil, fmt.Errorf("value %v: %w", s.Value[1], err)
		}
		out = append(out, v)
	}
	return out, nil
}

// TestDashboard runs Debian's prometheus with docs/grafana/prometheus.yml
// (targets rewritten to this stack) against two frontends and three workers,
// makes traffic of every kind the dashboard shows (streams, kill -9s and
// their migrations, a request over --migration-max-seq-len, a rejection, a
// cancellation, a resume, canaries), and checks that every PromQL
// expression of docs/grafana/baton.json parses and returns data.
func TestDashboard(t *testing.T) {
	t.Parallel() // waits on prometheus's scrapes, with no timing bound of its own
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("no prometheus in PATH: install Debian's prometheus package (.ci/run does)")
	}
	exprs := dashboardExprs(t, filepath.Join("..", "docs", "grafana", "baton.json"))

	s := newStack(t)
	fe1 := s.frontend(nil, "--migration-limit", "3", "--nats-system-url", s.sysURL())
	// fe2 disables migration for every request (max-seq-len 1) and calls a
	// worker busy as soon as it holds a KV block.
	fe2 := s.frontend(nil, "--migration-limit", "3", "--migration-max-seq-len", "1", "--active-decode-blocks-threshold", "0")
	s.workerEnv = []string{"DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS=1", "DYN_HEALTH_CHECK_ENABLED=true", "DYN_CANARY_WAIT_TIME=1"}
	var workerTargets []string
	// Three workers: two are killed by the migrations below, the third
	// still reports readiness and canaries at the end.
	for _, id := range []string{"w1", "w2", "w3"} {
		port := freePort(t)
		s.worker(id, "--mock-tokens-per-sec", "50", "--mock-ttft", "10ms", "--system-port", strconv.Itoa(port))
		workerTargets = append(workerTargets, fmt.Sprintf("%q", "127.0.0.1:"+strconv.Itoa(port)))
	}
	fe1.waitRoutable(t, "w1", "w2", "w3")
	fe2.waitRoutable(t, "w1", "w2", "w3")

	// Prometheus, with the shipped config scraping this stack every second.
	cfg, err := os.ReadFile(filepath.Join("..", "docs", "grafana", "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	host := func(u string) string { return fmt.Sprintf("%q", strings.TrimPrefix(u, "http://")) }
	rewrites := []struct{ old, new string }{
		{"scrape_interval: 5s", "scrape_interval: 1s"},
		{`"localhost:8000"`, host(fe1.url) + ", " + host(fe2.url)},
		{`"localhost:9091", "localhost:9092"`, strings.Join(workerTargets, ", ")},
	}
	conf := string(cfg)
	for _, r := range rewrites {
		if !strings.Contains(conf, r.old) {
			t.Fatalf("docs/grafana/prometheus.yml lacks %q", r.old)
		}
		conf = strings.ReplaceAll(conf, r.old, r.new) // the frontends twice: /metrics and /metrics/tenants
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	promPort := freePort(t)
	promURL := "http://127.0.0.1:" + strconv.Itoa(promPort)
	prom := exec.Command(promBin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:"+strconv.Itoa(promPort))
	var promLog strings.Builder
	var promMu sync.Mutex
	prom.Stdout, prom.Stderr = syncWriter{mu: &promMu, b: &promLog}, syncWriter{mu: &promMu, b: &promLog}
	if err := prom.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = prom.Process.Kill()
		_ = prom.Wait()
		if t.Failed() {
			promMu.Lock()
			t.Logf("---- prometheus ----\n%s", promLog.String())
			promMu.Unlock()
		}
	})
	waitFor(t, 30*time.Second, "prometheus to scrape all seven targets", func() bool {
		v, err := promQuery(promURL, `sum(up)`)
		return err == nil && len(v) == 1 && v[0] == 7
	})

	// Traffic. One request on fe2 goes over its max-seq-len at once.
	if res := postStream(t, fe2.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "over the limit", "max_tokens": 5}, nil, nil); !res.done {
		t.Fatalf("request on fe2 did not complete: %+v", res)
	}
	for i := range 4 {
		if res := postStream(t, fe1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": fmt.Sprintf("short %d", i), "max_tokens": 10}, nil, nil); !res.done {
			t.Fatalf("short request %d did not complete", i)
		}
	}
	// Two long streams whose worker is killed mid-stream: two
	// ongoing_request migrations (a histogram's rate, and so its quantiles,
	// needs its series to grow after it first appears, as a real
	// deployment's does).
	const prompt = "the long one"
	res := faultAfter(t, fe1, "dash-long", prompt, 150, 20, func(w string) { s.workers[w].signal(syscall.SIGKILL) })
	checkComplete(t, res, prompt, 150)
	res = faultAfter(t, fe1, "dash-long-2", prompt+" again", 150, 20, func(w string) { s.workers[w].signal(syscall.SIGKILL) })
	checkComplete(t, res, prompt+" again", 150)
	// A resume of the finished stream.
	resp, err := http.Get(fe1.url + "/v1/requests/dash-long/stream")
	if err != nil {
		t.Fatal(err)
	}
	if r := readStream(t, resp, nil); !r.done {
		t.Fatalf("resume did not replay to [DONE]")
	}
	resp.Body.Close()
	// A request killed through the API while the only worker left holds it;
	// meanwhile fe2 (busy at any KV block) rejects a new one.
	victim := make(chan sseResult, 1)
	go func() {
		victim <- postStream(t, fe1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "to be killed", "max_tokens": 1000},
			map[string]string{"X-Request-Id": "dash-victim"}, nil)
	}()
	waitFor(t, 20*time.Second, "the victim to run", func() bool {
		st, ok := tryState(fe1, "dash-victim")
		return ok && st.TokensGenerated > 5
	})
	waitFor(t, 20*time.Second, "a rejection on fe2", func() bool {
		r := send(t, fe2.url, "rejected?", 3, false, nil)
		return r.err == nil && r.status == http.StatusServiceUnavailable
	})
	cancelRequest(t, fe1, "dash-victim", "kill")
	if r := <-victim; r.done {
		t.Fatalf("the killed request completed")
	}

	// Every expression parses and returns a number once Prometheus has
	// scraped what happened (each panel's series appear within a few scrapes).
	for title, list := range exprs {
		for _, e := range list {
			var lastErr error
			var last []float64
			ok := false
			deadline := time.Now().Add(20 * time.Second)
			for !ok && time.Now().Before(deadline) {
				last, lastErr = promQuery(promURL, e)
				if lastErr != nil && strings.Contains(lastErr.Error(), "parse error") {
					break
				}
				for _, v := range last {
					ok = ok || !math.IsNaN(v)
				}
				if !ok {
					time.Sleep(500 * time.Millisecond) // the next scrape
				}
			}
			if !ok {
				t.Errorf("panel %q: %s: no data (values %v, error %v)", title, e, last, lastErr)
			}
		}
	}
}
