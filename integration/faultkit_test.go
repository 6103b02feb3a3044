package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// The fault tests' kit: a stack of one frontend and scripted workers, a
// request's full state, streams timed or cut at an offset, the log read
// directly, and the checks of a migrated request.

// faultOpts describes a stack for a fault test.
type faultOpts struct {
	workers      int                 // workers w1..wN
	tokensPerSec int                 // mock decode rate; default 100
	advisory     bool                // frontend gets the system-account URL (crash fast path)
	workerArgs   []string            // extra args of every worker
	perWorker    map[string][]string // extra args of one worker, by id
	frontendEnv  []string
	frontendArgs []string
}

// faultStack starts NATS, one frontend and the workers of o (with a 1 s drain
// budget), and waits until the frontend sees every worker routable.
func faultStack(t *testing.T, o faultOpts) (*stack, *frontend, []string) {
	t.Helper()
	if o.tokensPerSec == 0 {
		o.tokensPerSec = 100
	}
	s := newStack(t)
	args := o.frontendArgs
	if o.advisory {
		args = append(args, "--nats-system-url", s.sysURL())
	}
	fe := s.frontend(o.frontendEnv, args...)
	s.workerEnv = []string{"DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS=1"}
	var ids []string
	for i := 1; i <= o.workers; i++ {
		id := fmt.Sprintf("w%d", i)
		wa := append([]string{"--mock-tokens-per-sec", strconv.Itoa(o.tokensPerSec), "--mock-ttft", "10ms"}, o.workerArgs...)
		s.worker(id, append(wa, o.perWorker[id]...)...)
		ids = append(ids, id)
	}
	fe.waitRoutable(t, ids...)
	return s, fe, ids
}

type apiErrorBody struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
}

// completion is the body of a completion request for the mock model.
func completion(prompt string, maxTokens int) map[string]any {
	return map[string]any{"model": "mock", "prompt": prompt, "max_tokens": maxTokens}
}

// tryPost sends a request and returns the response or the transport error;
// unlike post it may run outside the test goroutine.
func tryPost(ctx context.Context, url string, body map[string]any, header map[string]string) (*http.Response, error) {
	data, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	return http.DefaultClient.Do(req)
}

// streamWithin streams a completion like postStream but fails the test if
// the stream has not ended within limit (a hang), and reports how long it took.
func streamWithin(t *testing.T, limit time.Duration, fe *frontend, id string, body map[string]any, onEvent func(sseEvent)) (sseResult, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	body["stream"] = true
	header := map[string]string{}
	if id != "" {
		header["X-Request-Id"] = id
	}
	begin := time.Now()
	resp, err := tryPost(ctx, fe.url+"/v1/completions", body, header)
	if err != nil {
		t.Fatalf("POST %s: %v", fe.url, err)
	}
	defer resp.Body.Close()
	res := readStream(t, resp, onEvent)
	took := time.Since(begin)
	if ctx.Err() != nil {
		t.Fatalf("stream %s did not end within %v (hang): got %d events, last %+v", id, limit, len(res.events), lastEvent(res))
	}
	return res, took
}

func lastEvent(res sseResult) sseEvent {
	if len(res.events) == 0 {
		return sseEvent{}
	}
	return res.events[len(res.events)-1]
}

// onOffset returns an onEvent callback that runs fn once, the first time an
// event's id (token offset) reaches n.
func onOffset(n int, fn func()) func(sseEvent) {
	var once sync.Once
	return func(e sseEvent) {
		if off, err := strconv.Atoi(e.id); err == nil && off >= n {
			once.Do(fn)
		}
	}
}

// occupy makes worker id the more loaded one, so that the least-loaded router
// deterministically prefers every other worker: a long request pinned to id
// (X-Worker-Id) runs until the test ends. It returns once the pinned request
// streams, i.e. once the frontend counts it against id.
func occupy(t *testing.T, fe *frontend, id string) {
	t.Helper()
	pinStream(t, fe, id)
	// The load report follows the dispatch; wait until discovery shows it,
	// so that both the frontend's own count and the worker's report agree.
	waitFor(t, 10*time.Second, id+" reported busy", func() bool {
		w, ok := fe.workerNamed(id)
		return ok && w.Load.ActiveRequests >= 1
	})
}

// jetStream connects to the stack's NATS server for direct inspection or
// manipulation of the log.
func (s *stack) jetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	return natstest.JetStream(t, s.natsURL)
}

// readLog reads request id from the log, learning the request log's layout
// from the server as every reader does.
func readLog(ctx context.Context, t testing.TB, js jetstream.JetStream, id string) iter.Seq2[events.Envelope, error] {
	t.Helper()
	parts, err := streams.Discover(ctx, js)
	if err != nil {
		t.Fatalf("discover the request log: %v", err)
	}
	return streams.ReadRequest(ctx, js, parts, id, 1)
}

// deleteLease removes worker id's lease key, as an operator or a control
// plane removing the worker from discovery would.
func (s *stack) deleteLease(t *testing.T, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := s.jetStream(t).KeyValue(ctx, streams.LeasesBucket)
	if err != nil {
		t.Fatalf("open %s: %v", streams.LeasesBucket, err)
	}
	if err := kv.Delete(ctx, id); err != nil {
		t.Fatalf("delete lease %s: %v", id, err)
	}
}

// migratedOnce checks that request id's stream res completed with the
// undisturbed answer of maxTokens to prompt after one ongoing_request
// migration, and returns the request's state as fe tells it.
func migratedOnce(t *testing.T, fe *frontend, id string, res sseResult, prompt string, maxTokens int) requestState {
	t.Helper()
	checkComplete(t, res, prompt, maxTokens)
	st := fe.state(t, id)
	checkMigrated(t, st, 1, events.MigrationOngoingRequest)
	return st
}

// checkMigrated checks that the request migrated exactly n times, every time
// as migration type typ, at increasing offsets, from distinct workers.
func checkMigrated(t *testing.T, st requestState, n int, typ string) {
	t.Helper()
	if len(st.Migrations) != n {
		t.Fatalf("migrations = %+v, want %d", st.Migrations, n)
	}
	seen := map[string]bool{}
	prev := -1
	for _, m := range st.Migrations {
		if m.MigrationType != typ {
			t.Errorf("migration %+v: type %q, want %q", m, m.MigrationType, typ)
		}
		if m.Offset <= prev && typ == "ongoing_request" {
			t.Errorf("migration offsets do not increase: %+v", st.Migrations)
		}
		if seen[m.FromWorker] {
			t.Errorf("two migrations from worker %s: %+v", m.FromWorker, st.Migrations)
		}
		seen[m.FromWorker] = true
		prev = m.Offset
	}
	if st.TokensGenerated != st.MaxTokens || st.Status != "completed" {
		t.Errorf("state: status %q, %d tokens generated, want completed with max_tokens %d", st.Status, st.TokensGenerated, st.MaxTokens)
	}
}
