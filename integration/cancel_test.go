package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
)

func cancelRequest(t testing.TB, f *frontend, id, mode string) map[string]any {
	t.Helper()
	resp := post(t, f.url+"/v1/requests/"+id+"/cancel", map[string]any{"mode": mode}, nil)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("cancel %s: status %d: %s", id, resp.StatusCode, body)
	}
	var out map[string]any
	_ = json.Unmarshal(body, &out)
	return out
}

// workersIdle waits until no worker reports an active request.
func workersIdle(t testing.TB, f *frontend) {
	t.Helper()
	waitFor(t, 10*time.Second, "workers to go idle", func() bool {
		ws, err := f.workers()
		if err != nil {
			return false
		}
		for _, w := range ws {
			if w.Load.ActiveRequests != 0 {
				return false
			}
		}
		return true
	})
}

// TestCancelStopAndKill: stop ends the stream normally with finish_reason
// cancelled and [DONE]; kill ends it with an error event; a non-streaming
// request that is killed gets 499; cancelling a finished request is a no-op
// that says so; both free the worker.
func TestCancelStopAndKill(t *testing.T) {
	_, f1, _ := twoFrontends(t)
	prompt := "cancel me"
	body := map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 500}
	var once sync.Once
	stopped := postStream(t, f1.url, "/v1/completions", body, map[string]string{"X-Request-Id": "c-stop"}, func(e sseEvent) {
		if n, _ := strconv.Atoi(e.id); n >= 10 {
			once.Do(func() { cancelRequest(t, f1, "c-stop", "stop") })
		}
	})
	if !stopped.done || stopped.finish != "cancelled" || stopped.errorBody != "" {
		t.Errorf("stop: done=%v finish=%q error=%s, want [DONE] and cancelled", stopped.done, stopped.finish, stopped.errorBody)
	}
	if want := engine.MockText(prompt, 0, 500); !strings.HasPrefix(want, stopped.text) || len(stopped.text) >= len(want) {
		t.Errorf("stop: text is not a strict prefix of the full output: %q", stopped.text)
	}
	checkIDs(t, stopped, 0)

	var once2 sync.Once
	killed := postStream(t, f1.url, "/v1/completions", body, map[string]string{"X-Request-Id": "c-kill"}, func(e sseEvent) {
		if n, _ := strconv.Atoi(e.id); n >= 10 {
			once2.Do(func() { cancelRequest(t, f1, "c-kill", "kill") })
		}
	})
	if killed.done || !strings.Contains(killed.errorBody, "cancel") {
		t.Errorf("kill: done=%v error=%q, want an error event and no [DONE]", killed.done, killed.errorBody)
	}

	// Non-streaming, killed from another client while it waits.
	go func() {
		waitFor(t, 10*time.Second, "c-unary to start", func() bool {
			resp, err := http.Get(f1.url + "/v1/requests/c-unary")
			if err == nil {
				resp.Body.Close()
			}
			return err == nil && resp.StatusCode == 200
		})
		cancelRequest(t, f1, "c-unary", "kill")
	}()
	resp := post(t, f1.url+"/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 500},
		map[string]string{"X-Request-Id": "c-unary"})
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 499 || !strings.Contains(string(b), `"error"`) {
		t.Errorf("killed unary: status %d body %s, want 499 with an error body", resp.StatusCode, b)
	}

	again := cancelRequest(t, f1, "c-stop", "kill")
	if again["cancelled"] != false || !strings.Contains(again["message"].(string), "already ended") {
		t.Errorf("cancel of a finished request = %v, want a no-op that says so", again)
	}
	workersIdle(t, f1)
	if got := f1.metric(t, "dynamo_frontend_model_cancellation_total", "model", "mock"); got != 3 {
		t.Errorf("cancellation_total = %v, want 3", got)
	}
}

// TestClientDisconnectFreesWorker: a non-resumable client that goes away
// kills its request; the worker stops within a token interval.
func TestClientDisconnectFreesWorker(t *testing.T) {
	_, f1, _ := twoFrontends(t)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f1.url+"/v1/completions",
		jsonBody(map[string]any{"model": "mock", "prompt": "leave early", "max_tokens": 1000, "stream": true}))
	req.Header.Set("X-Request-Id", "gone")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readStream(t, resp, func(e sseEvent) {
		if n, _ := strconv.Atoi(e.id); n >= 5 {
			cancel()
		}
	})
	resp.Body.Close()
	waitFor(t, 10*time.Second, "the request to be cancelled", func() bool { return f1.state(t, "gone").Status == "cancelled" })
	workersIdle(t, f1)
	st := f1.state(t, "gone")
	time.Sleep(200 * time.Millisecond) // 20 token intervals: nothing more may be generated
	if after := f1.state(t, "gone"); after.TokensGenerated != st.TokensGenerated {
		t.Errorf("tokens grew after the kill: %d -> %d", st.TokensGenerated, after.TokensGenerated)
	}
	if got := f1.metric(t, "dynamo_frontend_disconnected_clients"); got < 1 {
		t.Errorf("disconnected_clients = %v", got)
	}
}

// TestChoicesAndParentCancel: n=3 runs three child requests (each the
// deterministic text), and cancelling a parent stops its children on
// different workers.
func TestChoicesAndParentCancel(t *testing.T) {
	_, f1, f2 := twoFrontends(t)
	prompt := "three ways"
	res := postStream(t, f1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 20, "n": 3},
		map[string]string{"X-Request-Id": "three"}, nil)
	if !res.done {
		t.Fatalf("n=3 stream: %s", res.errorBody)
	}
	want := engine.MockText(prompt, 0, 20)
	for i := range 3 {
		if st := f1.state(t, "three-"+strconv.Itoa(i)); st.Status != "completed" || st.TokensGenerated != 20 {
			t.Errorf("choice %d: %+v", i, st)
		}
	}
	if res.text != want+want+want && len(res.text) != 3*len(want) {
		t.Errorf("n=3 delivered %d bytes, want %d", len(res.text), 3*len(want))
	}

	// A parent with three children, started through two frontends.
	parentDone := make(chan sseResult, 1)
	go func() {
		parentDone <- postStream(t, f1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "parent", "max_tokens": 1000},
			map[string]string{"X-Request-Id": "parent"}, nil)
	}()
	waitFor(t, 10*time.Second, "parent to run", func() bool {
		resp, err := http.Get(f1.url + "/v1/requests/parent")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	children := make(chan sseResult, 3)
	for i, f := range []*frontend{f1, f2, f2} {
		go func() {
			children <- postStream(t, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "child " + strconv.Itoa(i), "max_tokens": 1000},
				map[string]string{"X-Request-Id": "child-" + strconv.Itoa(i), "X-Parent-Request-Id": "parent"}, nil)
		}()
	}
	waitFor(t, 10*time.Second, "children to be linked", func() bool {
		var st struct {
			Children []string `json:"children"`
		}
		getJSON(t, f1.url+"/v1/requests/parent", 200, &st)
		return len(st.Children) == 3
	})
	cancelRequest(t, f2, "parent", "kill")
	if p := <-parentDone; p.done {
		t.Error("parent stream completed after a kill")
	}
	for range 3 {
		if c := <-children; c.done || !strings.Contains(c.errorBody, "cancel") {
			t.Errorf("child: done=%v error=%q, want a cancel error", c.done, c.errorBody)
		}
	}
	workersIdle(t, f1)
}
