package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// The console in headless chromium against real processes: the live feed
// and timelines (TestConsoleBrowser), and the tenants panel.

// chromiumPath finds Debian's chromium (installed by .ci/run when missing).
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium in PATH: install Debian's chromium package (.ci/run does)")
	return ""
}

// newBrowser starts headless chromium for the test and returns a tab's context.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.NoSandbox, // the tests run as root in CI
		chromedp.WindowSize(1400, 1000),
		chromedp.Flag("disable-dev-shm-usage", true),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// browse runs chromedp actions with a deadline, failing the test with what
// was being waited for.
func browse(t *testing.T, ctx context.Context, timeout time.Duration, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := chromedp.Do(cctx, steps...); err != nil {
		t.Fatalf("browser: %s: %v", what, err)
	}
}

// value runs one action that returns a value.
func value[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(cctx, a)
	if err != nil {
		t.Fatalf("browser: %s: %v", what, err)
	}
	return v
}

// css selects the first element that matches a CSS selector.
func css(sel string) chromedp.CSS { return chromedp.CSS(sel) }

func screenshot(t *testing.T, ctx context.Context, paths ...string) {
	t.Helper()
	png := value(t, ctx, "screenshot", chromedp.FullScreenshot(100))
	for _, p := range paths {
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatalf("write %s: %v", p, err)
		}
		t.Logf("screenshot: %s", p)
	}
}

// TestConsoleBrowser drives the console in real headless chromium against
// real processes: it sees both workers, watches a kill -9 turn into a
// migration in the live feed without a reload and the killed worker's row
// marked lost with the reason, opens the request's timeline (two attempt
// lanes, the cut at the offset the log recorded), kills another request
// with the page's button while its timeline is open (whose stop and kill
// buttons go away then, and are not offered for a finished request), and
// follows the page as it fails over to the second frontend when its own is
// killed (where the lost worker has dropped off: that frontend lists lost
// workers for a second). A page opened afresh there shows the feed in time
// order, although the frontend read the two streams' backlogs at once. The
// request log has three partitions, so the feed cursor the page resumes
// with has a sequence per partition. Set UPDATE_CONSOLE_PNG=1 to rewrite
// docs/console.png from the run.
func TestConsoleBrowser(t *testing.T) {
	s := newStack(t)
	s.partitions = testPartitions
	args := []string{"--migration-limit", "3", "--nats-system-url", s.sysURL()}
	fe1 := s.frontend(nil, args...)
	fe2 := s.frontend(nil, append(args, "--console-lost-workers", "1s")...)
	s.workerEnv = []string{"DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS=1"}
	for _, id := range []string{"w1", "w2"} { // held at token 40 until the page has killed the victim
		s.worker(id, "--mock-tokens-per-sec", "40", "--mock-ttft", "10ms", "--mock-hold-at-token", "40")
	}
	fe1.waitRoutable(t, "w1", "w2")
	fe2.waitRoutable(t, "w1", "w2")

	ctx := newBrowser(t)
	sent := recordRequests(ctx)
	browse(t, ctx, 20*time.Second, "load the console and see both workers",
		chromedp.Navigate(fe1.url+"/console"),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[float64](`window.__loaded = performance.timeOrigin`)(ctx, tg)
			return err
		}),
		chromedp.WaitVisible(css(`#workers tr[data-worker="w1"][data-state="ready"]`)),
		chromedp.WaitVisible(css(`#workers tr[data-worker="w2"][data-state="ready"]`)),
		chromedp.WaitVisible(css(`#conn[data-frontend="frontend-1"]`)),
	)
	loadedAt := value(t, ctx, "read the load time", chromedp.Evaluate[float64](`window.__loaded`))
	// From here on every call of the page carries the key.
	keyed := sent.len()
	browse(t, ctx, 10*time.Second, "enter an API key",
		chromedp.SendKeys(css(`#key`), "test-key"),
		chromedp.Click(css(`#keyform button`)),
	)

	// A long stream, and another one to kill from the page later: both run
	// until the release below (held at token 40, the long one again after
	// its migration), however long the page takes.
	const prompt = "a long story about migrations"
	longDone := make(chan sseResult, 1)
	go func() {
		longDone <- postStream(t, fe1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 400},
			map[string]string{"X-Request-Id": "long"}, nil)
	}()
	victimDone := make(chan sseResult, 1)
	go func() {
		victimDone <- postStream(t, fe2.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "the victim", "max_tokens": 2000},
			map[string]string{"X-Request-Id": "victim"}, nil)
	}()
	var worker string
	waitFor(t, 20*time.Second, "20 tokens of the long stream", func() bool {
		st, ok := tryState(fe1, "long")
		worker = st.Worker
		return ok && st.TokensGenerated >= 20 && worker != ""
	})
	s.workers[worker].signal(syscall.SIGKILL)

	lostRow := `#workers tr[data-worker="` + worker + `"]`
	browse(t, ctx, 20*time.Second, "see the migration in the live feed, and the worker lost",
		chromedp.WaitVisible(css(`#feed li[data-kind="migrated"][data-request="long"]`)),
		chromedp.WaitVisible(css(`#requests tr[data-request="long"][data-status="running"]`)),
		chromedp.WaitVisible(css(lostRow+`[data-state="lost"]`)),
		// The lease goes first (revoked on the disconnect advisory), then
		// the lost event says why.
		chromedp.Poll[chromedp.Void](`(document.querySelector('`+lostRow+`[data-state="lost"] .reason') || {}).textContent?.startsWith('disconnected')`,
			chromedp.WithPollingInterval(50*time.Millisecond)),
	)
	// A worker registered between the migration and the kill below: the
	// two streams' events interleave in time.
	s.worker("w3", "--mock-tokens-per-sec", "40", "--mock-ttft", "10ms")
	fe1.waitRoutable(t, "w3")
	browse(t, ctx, 20*time.Second, "see the new worker",
		chromedp.WaitVisible(css(`#feed li[data-kind="registered"][data-worker="w3"]`)),
		chromedp.WaitVisible(css(`#workers tr[data-worker="w3"][data-state="ready"]`)),
	)
	now := value(t, ctx, "check the page was not reloaded", chromedp.Evaluate[float64](`window.__loaded`))
	if now != loadedAt {
		t.Fatalf("the page was reloaded (load time %v, then %v)", loadedAt, now)
	}

	st := fe1.state(t, "long")
	if len(st.Migrations) != 1 {
		t.Fatalf("long has %d migrations, want 1: %+v", len(st.Migrations), st)
	}
	cut := st.Migrations[0].Offset
	browse(t, ctx, 20*time.Second, "open the timeline and see two attempt lanes",
		chromedp.Click(css(`#feed li[data-kind="migrated"][data-request="long"] a[data-open]`)),
		chromedp.WaitVisible(css(`#timeline[data-request="long"] .lane[data-attempt="1"]`)),
	)
	lanes := value(t, ctx, "count the lanes", chromedp.Evaluate[int](`document.querySelectorAll('#timeline .lane[data-attempt]').length`))
	gotCut := value(t, ctx, "read the cut", chromedp.AttributeValue(css(`#timeline .lane[data-attempt="0"]`), "data-cut")).Value
	lane1Start := value(t, ctx, "read the second lane's start", chromedp.AttributeValue(css(`#timeline .lane[data-attempt="1"]`), "data-start")).Value
	if lanes != 2 {
		t.Fatalf("timeline has %d attempt lanes, want 2", lanes)
	}
	if gotCut != strconv.Itoa(cut) || lane1Start != strconv.Itoa(cut) {
		t.Fatalf("timeline cuts attempt 0 at %q and starts attempt 1 at %q, want both at the migration's offset %d", gotCut, lane1Start, cut)
	}
	text := value(t, ctx, "read the text as it grew", chromedp.Text(css(`#tl-text`)))
	if !strings.Contains(text, "‖") {
		t.Errorf("the text as it grew shows no cut mark: %q", text)
	}

	browse(t, ctx, 20*time.Second, "open the other request's timeline while it runs: stop and kill are offered",
		chromedp.WaitVisible(css(`#requests tr[data-request="victim"][data-status="running"]`)),
		chromedp.Click(css(`#requests tr[data-request="victim"] a[data-open]`)),
		chromedp.WaitVisible(css(`#timeline[data-request="victim"][data-status="running"]`)),
		chromedp.WaitVisible(css(`#timeline-panel button[data-tl-action="stop"]`)),
		chromedp.WaitVisible(css(`#timeline-panel button[data-tl-action="kill"]`)),
	)
	browse(t, ctx, 20*time.Second, "kill it with the page's button: its timeline's buttons go",
		chromedp.Click(css(`#requests button[data-action="kill"][data-request="victim"]`)),
		chromedp.WaitVisible(css(`#requests tr[data-request="victim"][data-status="cancelled"]`)),
		chromedp.WaitVisible(css(`#timeline[data-request="victim"][data-status="cancelled"]`)),
		chromedp.WaitNotVisible(css(`#timeline-panel button[data-tl-action="stop"]`)),
		chromedp.WaitNotVisible(css(`#timeline-panel button[data-tl-action="kill"]`)),
	)
	waitErrorEnd(t, victimDone, "the killed request's stream")
	s.release(worker)
	res := <-longDone
	checkComplete(t, res, prompt, 400)
	browse(t, ctx, 20*time.Second, "see the long request complete",
		chromedp.WaitVisible(css(`#requests tr[data-request="long"][data-status="completed"]`)),
		chromedp.Click(css(`#requests tr[data-request="long"] a[data-open]`)),
		chromedp.WaitVisible(css(`#timeline[data-request="long"][data-status="completed"]`)),
	)
	noActions(t, ctx, "the completed request's timeline")
	// Once its owner has compacted it, the timeline still shows both lanes
	// and the whole text, coloured by attempt, with the cut.
	waitFor(t, 20*time.Second, "long to be compacted", func() bool {
		out, _, code := runTool(t, batonBin, "replay", "--json", "--nats", s.natsURL, "long")
		return code == 0 && strings.Contains(out, `"baton.request.compacted.v1"`) && workerDeltas(t, out) == 0
	})
	browse(t, ctx, 20*time.Second, "open the compacted timeline",
		chromedp.Click(css(`#feed li[data-kind="migrated"][data-request="long"] a[data-open]`)),
		chromedp.WaitVisible(css(`#timeline[data-request="long"] .lane[data-attempt="1"]`)),
	)
	compacted := value(t, ctx, "read the compacted text", chromedp.Text(css(`#tl-text`)))
	if strings.Count(compacted, "‖") != 1 || strings.ReplaceAll(compacted, "‖", "") != res.text {
		t.Errorf("the compacted timeline's text %q, want the answer %q with one cut mark", compacted, res.text)
	}
	if n := value(t, ctx, "count the lanes", chromedp.Evaluate[int](`document.querySelectorAll('#timeline .lane[data-attempt]').length`)); n != 2 {
		t.Errorf("the compacted timeline has %d attempt lanes, want 2", n)
	}
	noActions(t, ctx, "the compacted request's timeline")
	paths := []string{filepath.Join(t.TempDir(), "console.png")}
	if os.Getenv("UPDATE_CONSOLE_PNG") != "" {
		paths = append(paths, filepath.Join("..", "docs", "console.png"))
	}
	screenshot(t, ctx, paths...)

	// The page's frontend dies: it reconnects to the other one and catches up.
	fe1.signal(syscall.SIGKILL)
	fe1.wait(10 * time.Second)
	// A request on the second frontend, killed through the API: its row and
	// the feed's cancellation must reach the page.
	afterDone := make(chan sseResult, 1)
	go func() {
		afterDone <- postStream(t, fe2.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "after the failover", "max_tokens": 2000},
			map[string]string{"X-Request-Id": "after"}, nil)
	}()
	waitFor(t, 20*time.Second, "the request after the failover to run", func() bool {
		st, ok := tryState(fe2, "after")
		return ok && st.TokensGenerated > 0
	})
	cancelRequest(t, fe2, "after", "kill")
	<-afterDone
	browse(t, ctx, 30*time.Second, "fail over to the second frontend and catch up",
		chromedp.WaitVisible(css(`#conn[data-frontend="frontend-2"]`)),
		chromedp.WaitVisible(css(`#requests tr[data-request="after"][data-status="cancelled"]`)),
		chromedp.WaitVisible(css(`#feed li[data-kind="cancelled"][data-request="after"]`)),
		// The second frontend lists lost workers for a second only.
		chromedp.WaitNotPresent(css(lostRow)),
	)
	feedInTimeOrder(t, ctx, "the page that failed over")
	migrated := value(t, ctx, "count the feed's migrations",
		chromedp.Evaluate[int](`document.querySelectorAll('#feed li[data-kind="migrated"][data-request="long"]').length`))
	now = value(t, ctx, "read the load time", chromedp.Evaluate[float64](`window.__loaded`))
	if migrated != 1 {
		t.Errorf("the feed shows the migration %d times after the failover, want once", migrated)
	}
	if now != loadedAt {
		t.Errorf("the page was reloaded to fail over")
	}
	screenshot(t, ctx, filepath.Join(t.TempDir(), "console-failover.png"))

	// Every API call after the key was entered carried it: the event stream
	// (reopened at once, and again on the second frontend), the timeline,
	// the cancel.
	calls := map[string]int{}
	for _, r := range sent.since(keyed) {
		if !strings.Contains(r.url, "/v1/") || r.method == http.MethodOptions {
			continue
		}
		if r.auth != "Bearer test-key" {
			t.Errorf("%s %s sent Authorization %q, want the key entered", r.method, r.url, r.auth)
		}
		switch {
		case strings.HasSuffix(r.url, "/v1/console/events"):
			calls["events"]++
		case strings.HasSuffix(r.url, "/timeline"):
			calls["timeline"]++
		case strings.HasSuffix(r.url, "/cancel"):
			calls["cancel"]++
		}
	}
	if calls["events"] < 2 || calls["timeline"] < 1 || calls["cancel"] != 1 {
		t.Errorf("calls with the key: %v, want the event stream twice or more, the timeline, one cancel", calls)
	}

	// A first load on the second frontend (the page loaded afresh there),
	// whose console read the backlogs of every partition and of the
	// workers at once when the page failed over to it: the feed is in time
	// order all the same.
	browse(t, ctx, 20*time.Second, "open the console afresh on the second frontend",
		chromedp.Navigate(fe2.url+"/console"),
		chromedp.WaitVisible(css(`#feed li[data-kind="cancelled"][data-request="after"]`)),
		chromedp.WaitVisible(css(`#feed li[data-kind="registered"][data-worker="w1"]`)),
	)
	feed := feedInTimeOrder(t, ctx, "a first load")
	// Workers' and requests' events alternate in time, so a feed that put
	// one stream's backlog after the other's would fail the check above.
	var order []string
	for _, e := range feed {
		switch {
		case e.Kind == "registered" && (e.Who == "w1" || e.Who == "w3"), e.Kind == "migrated" && e.Who == "long", e.Kind == "cancelled" && e.Who == "victim":
			order = append(order, e.Kind+" "+e.Who)
		}
	}
	if want := []string{"cancelled victim", "registered w3", "migrated long", "registered w1"}; strings.Join(order, ", ") != strings.Join(want, ", ") {
		t.Errorf("a first load's feed shows %v, want %v (newest first)", order, want)
	}
}

// noActions fails the test unless the open timeline offers no stop or kill.
func noActions(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	n := value(t, ctx, "count the timeline's buttons", chromedp.Evaluate[int](
		`[...document.querySelectorAll('#timeline-panel [data-tl-action]')].filter((b) => b.offsetParent !== null && !b.disabled).length`))
	if n != 0 {
		t.Errorf("%s offers %d stop or kill buttons, want none", what, n)
	}
}

// feedLine is an entry of the page's live feed.
type feedLine struct {
	Time, Stream, Kind, Who string
	Seq                     int
}

// feedInTimeOrder reads the page's feed and fails the test unless it is
// newest first by event time, and by sequence within a stream.
func feedInTimeOrder(t *testing.T, ctx context.Context, what string) []feedLine {
	t.Helper()
	lines := value(t, ctx, "read the feed", chromedp.Evaluate[[]feedLine](`[...document.querySelectorAll('#feed li')].map((li) => ({
		Time: li.dataset.time, Stream: li.dataset.stream, Kind: li.dataset.kind,
		Who: li.dataset.request || li.dataset.worker, Seq: Number(li.dataset.seq)}))`))
	if len(lines) == 0 {
		t.Fatalf("%s: the feed is empty", what)
	}
	var prev time.Time
	for i, l := range lines {
		at, err := time.Parse(time.RFC3339Nano, l.Time)
		if err != nil {
			t.Fatalf("%s: feed entry %d %+v: %v", what, i, l, err)
		}
		if i > 0 && (at.After(prev) || (l.Stream == lines[i-1].Stream && at.Equal(prev) && l.Seq > lines[i-1].Seq)) {
			t.Errorf("%s: feed entry %d (%s %s at %s, %s #%d) is below entry %d (%s %s at %s, %s #%d), want newest first",
				what, i, l.Kind, l.Who, l.Time, l.Stream, l.Seq,
				i-1, lines[i-1].Kind, lines[i-1].Who, lines[i-1].Time, lines[i-1].Stream, lines[i-1].Seq)
		}
		prev = at
	}
	return lines
}

// sentRequest is a request the page sent, as the browser reported it.
type sentRequest struct{ method, url, auth string }

type requestLog struct {
	mu   sync.Mutex
	reqs []sentRequest
}

func (l *requestLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.reqs)
}

func (l *requestLog) since(n int) []sentRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]sentRequest(nil), l.reqs[n:]...)
}

// recordRequests records every request the tab sends, until ctx ends.
func recordRequests(ctx context.Context) *requestLog {
	l := &requestLog{}
	evs := chromedp.Events(ctx, network.RequestWillBeSent)
	go func() {
		for ev, err := range evs {
			if err != nil {
				return
			}
			if ev.Request == nil {
				continue
			}
			r := sentRequest{method: ev.Request.Method, url: ev.Request.URL}
			for k, v := range ev.Request.Headers {
				if strings.EqualFold(k, "Authorization") {
					r.auth, _ = v.(string)
				}
			}
			l.mu.Lock()
			l.reqs = append(l.reqs, r)
			l.mu.Unlock()
		}
	}()
	return l
}

// tryState reads GET /v1/requests/{id} without failing the test (the
// request may not be in the log yet).
func tryState(f *frontend, id string) (requestState, bool) {
	var st requestState
	resp, err := httpGetJSON(f.url+"/v1/requests/"+id, &st)
	return st, err == nil && resp == 200
}

func httpGetJSON(url string, v any) (int, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return resp.StatusCode, fmt.Errorf("status %d", resp.StatusCode)
	}
	return resp.StatusCode, json.NewDecoder(resp.Body).Decode(v)
}

// TestConsoleTenants: the console's tenants panel, in headless chromium,
// lists every tenant of the keys file with the admin's key, and shows
// alice's budget left across the frontends, her share of the log, and what
// this frontend admitted and refused of hers.
func TestConsoleTenants(t *testing.T) {
	t.Parallel() // no timing bound of its own
	s := newStack(t)
	args, _ := s.tenantFiles(t, "alice rpm=20 log=0.3\n", "alice "+aliceKey, "bob "+bobKey, "admin "+adminKey)
	f := s.frontend(nil, args...)
	s.worker("w1", "--mock-tokens-per-sec", "2000", "--mock-ttft", "1ms")
	waitRoutableAs(t, apiClient{f.url, adminKey}, "w1")
	body, _ := bodyOf(map[string]any{"model": "mock", "prompt": "counted", "max_tokens": 2})
	var codes []int
	for range 3 { // rpm 20: a burst of 2
		codes = append(codes, apiClient{f.url, aliceKey}.do(t, http.MethodPost, "/v1/completions", body, nil).status)
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 {
		t.Fatalf("alice's creates: got %v, want 200 200 429", codes)
	}
	apiClient{f.url, aliceKey}.get(t, "/v1/console/tenants").want(t, "the tenants panel's data with alice's key", http.StatusForbidden, "permission_denied")

	ctx := newBrowser(t)
	browse(t, ctx, 20*time.Second, "load the console and enter the admin's key",
		chromedp.Navigate(f.url+"/console"),
		chromedp.SendKeys(css(`#key`), adminKey),
		chromedp.Click(css(`#keyform button`)),
	)
	alice := `#tenants tr[data-tenant="alice"]`
	browse(t, ctx, 20*time.Second, "see alice's and bob's rows, alice's counts",
		chromedp.WaitVisible(css(`#tenants tr[data-tenant="bob"]`)),
		chromedp.WaitVisible(css(alice)),
		chromedp.Poll[chromedp.Void](`document.querySelector('`+alice+` td:nth-child(7)')?.textContent === '2'`,
			chromedp.WithPollingInterval(50*time.Millisecond)),
	)
	for _, c := range []struct{ col, want string }{
		{"2", "of 20/min"},
		{"5", " of "}, // her bytes of her share's limit
		{"8", "1 requests"},
	} {
		got := value(t, ctx, "read alice's column "+c.col, chromedp.Text(css(alice+` td:nth-child(`+c.col+`)`)))
		if !strings.Contains(got, c.want) {
			t.Errorf("alice's column %s: got %q, want it to contain %q", c.col, got, c.want)
		}
	}
}
