package integration

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
)

// resilientStream runs one streaming completion the way a careful client
// does: it posts with its own X-Request-Id, and whenever the stream is cut
// without [DONE] or an error event, it resumes from its last SSE id on
// whichever frontend pick returns. It returns the whole text and how many
// times it resumed.
func resilientStream(t testing.TB, pick func() *frontend, id, prompt string, maxTokens int) (string, int, error) {
	t.Helper()
	var text string
	last := ""
	resumes := 0
	accepted := false
	for attempt := 0; attempt < 20; attempt++ {
		f := pick()
		var res sseResult
		var req *http.Request
		if !accepted {
			// Until a frontend took the request, (re)post it: a retried POST
			// with the same X-Request-Id attaches if it exists.
			req, _ = http.NewRequest(http.MethodPost, f.url+"/v1/completions",
				jsonBody(map[string]any{"model": "mock", "prompt": prompt, "max_tokens": maxTokens, "stream": true}))
			req.Header.Set("X-Request-Id", id)
			req.Header.Set("X-Resumable", "true")
		} else {
			resumes++
			req, _ = http.NewRequest(http.MethodGet, f.url+"/v1/requests/"+id+"/stream", nil)
			req.Header.Set("Last-Event-ID", last)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue // that frontend is gone: try another
		}
		res = readStream(t, resp, nil)
		resp.Body.Close()
		accepted = accepted || res.status == 200
		if res.status != 200 {
			if res.status == http.StatusServiceUnavailable {
				continue // that frontend is draining: try another
			}
			return text, resumes, fmt.Errorf("status %d: %s", res.status, res.errorBody)
		}
		text += res.text
		if len(res.events) > 0 {
			last = lastID(res)
		}
		if res.done {
			return text, resumes, nil
		}
		if res.errorBody != "" {
			return text, resumes, fmt.Errorf("stream error: %s", res.errorBody)
		}
	}
	return text, resumes, fmt.Errorf("gave up after 20 attempts")
}

// TestRollingRestartOfFrontends SIGTERMs each frontend in turn under steady
// load and starts a new one in its place; every request completes, with the
// fault-free text, for clients that resume.
func TestRollingRestartOfFrontends(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	env := []string{"DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS=1"}
	args := []string{"--nats-system-url", s.sysURL()}
	var mu sync.Mutex
	fronts := []*frontend{s.frontend(env, args...), s.frontend(env, args...)}
	s.worker("w1", "--mock-tokens-per-sec", "150", "--mock-ttft", "10ms")
	s.worker("w2", "--mock-tokens-per-sec", "150", "--mock-ttft", "10ms")
	fronts[0].waitRoutable(t, "w1", "w2")
	fronts[1].waitRoutable(t, "w1", "w2")
	var next atomic.Int64
	pick := func() *frontend {
		mu.Lock()
		defer mu.Unlock()
		return fronts[int(next.Add(1))%len(fronts)]
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var completed, resumed atomic.Int64
	errs := make(chan error, 100)
	for c := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("roll-%d-%d", c, i)
				prompt := "rolling restart " + id
				text, n, err := resilientStream(t, pick, id, prompt, 200)
				if err != nil {
					errs <- fmt.Errorf("%s: %w", id, err)
					return
				}
				if want := engine.MockText(prompt, 0, 200); text != want {
					errs <- fmt.Errorf("%s: text differs from a fault-free run:\n got %q\nwant %q", id, text, want)
					return
				}
				completed.Add(1)
				resumed.Add(int64(n))
			}
		}()
	}
	for round := range 2 {
		for i := range 2 {
			time.Sleep(700 * time.Millisecond) // steady load between restarts (the scenario, not synchronisation)
			mu.Lock()
			old := fronts[i]
			mu.Unlock()
			old.signal(syscall.SIGTERM)
			if code := old.wait(15 * time.Second); code != 0 {
				t.Errorf("round %d: %s exited %d after SIGTERM, want 0", round, old.name, code)
			}
			nf := s.frontend(env, args...)
			nf.waitRoutable(t, "w1", "w2")
			mu.Lock()
			fronts[i] = nf
			mu.Unlock()
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if completed.Load() < 6 || resumed.Load() == 0 {
		t.Errorf("completed %d requests with %d resumes: the restarts did not cut any stream", completed.Load(), resumed.Load())
	}
	t.Logf("completed %d requests, %d resumes", completed.Load(), resumed.Load())
}
