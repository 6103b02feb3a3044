package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
)

// TestSIGSTOPServingWorker pauses the serving worker mid-stream. It keeps its
// TCP connection, so no disconnect advisory comes: the frontend notices either
// because the lease expires (a 2 s TTL, stall timeout left at 30 s) or because
// the stream stalls (a 1 s stall timeout, lease left at 10 s). Either way the
// request completes on the other worker with the fault-free text.
func TestSIGSTOPServingWorker(t *testing.T) {
	for _, tc := range []struct {
		name       string
		workerArgs []string
		feArgs     []string
		reason     string // the migration's recorded reason: which detector fired
	}{
		{"lease_expiry", []string{"--lease-ttl", "2s"}, nil, "worker_lost"},
		{"stall_timeout", nil, []string{"--stall-timeout", "1s"}, "stalled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, fe, _ := faultStack(t, faultOpts{workers: 2, workerArgs: tc.workerArgs,
				frontendArgs: append([]string{"--migration-limit", "3"}, tc.feArgs...)})
			prompt := "sigstop " + tc.name
			var stopped string
			res, _ := streamWithin(t, 30*time.Second, fe, "stop", completion(prompt, 150), onOffset(20, func() {
				stopped = fe.servingWorker(t, "stop")
				s.workers[stopped].signal(syscall.SIGSTOP)
			}))
			st := migratedOnce(t, fe, "stop", res, prompt, 150)
			if m := st.Migrations[0]; m.FromWorker != stopped || m.Reason != tc.reason {
				t.Errorf("migration = %+v, want from %s for %q", m, stopped, tc.reason)
			}
			if st.Worker == stopped {
				t.Errorf("continuation ran on the stopped worker %s", stopped)
			}
		})
	}
}

// TestNewRequestMigration fails the dispatch itself: the worker the router
// picks never accepts. To make the pick deterministic, w2 carries a long
// request pinned to it (X-Worker-Id), so the least-loaded router always
// chooses the idle w1 first. w1 then cannot accept:
//   - SIGKILL with no advisory and a 10 s lease: w1 is still in discovery but
//     its dispatch subscription is gone, so the dispatch gets "no responders"
//     at once (a crash between being routed and accepting);
//   - SIGSTOP: the dispatch is never answered and times out after the
//     frontend's 2 s dispatch timeout.
//
// Both are new_request migrations, and the request completes on w2.
func TestNewRequestMigration(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			s, fe, _ := faultStack(t, faultOpts{workers: 2, frontendArgs: []string{"--migration-limit", "3"}})
			occupy(t, fe, "w2")
			s.workers["w1"].signal(sig)
			prompt := "new request " + sig.String()
			res, _ := streamWithin(t, 30*time.Second, fe, "nr", completion(prompt, 40), nil)
			checkComplete(t, res, prompt, 40)
			st := fe.state(t, "nr")
			checkMigrated(t, st, 1, events.MigrationNewRequest)
			if m := st.Migrations[0]; m.FromWorker != "w1" || m.Offset != 0 {
				t.Errorf("migration = %+v, want from w1 at offset 0", m)
			}
			if len(st.Attempts) != 2 || st.Attempts[1].WorkerID != "w2" {
				t.Errorf("attempts = %+v, want w1 then w2", st.Attempts)
			}
			if got := fe.metric(t, "dynamo_frontend_model_migration_total", "model", "mock", "migration_type", "new_request"); got < 1 {
				t.Errorf("new_request migrations = %v, want >= 1", got)
			}
		})
	}
}

// TestCrashDuringMigration kills the serving worker twice in one request: the
// first worker, and then the worker the continuation landed on. With three
// workers and limit 3 the request completes with the fault-free text, and its
// state shows two migrations at increasing offsets.
func TestCrashDuringMigration(t *testing.T) {
	t.Parallel()
	s, fe, _ := faultStack(t, faultOpts{workers: 3, advisory: true, frontendArgs: []string{"--migration-limit", "3"}})
	prompt := "two migrations in one request"
	kill := func() { s.workers[fe.servingWorker(t, "twice")].signal(syscall.SIGKILL) }
	first, second := onOffset(30, kill), onOffset(90, kill)
	res, _ := streamWithin(t, 30*time.Second, fe, "twice", completion(prompt, 200), func(e sseEvent) {
		first(e)
		second(e)
	})
	checkComplete(t, res, prompt, 200)
	st := fe.state(t, "twice")
	checkMigrated(t, st, 2, events.MigrationOngoingRequest)
	if len(st.Attempts) != 3 {
		t.Errorf("attempts = %+v, want 3", st.Attempts)
	}
	if m := st.Migrations; len(m) == 2 && (m[0].Offset < 30 || m[1].Offset < 90) {
		t.Errorf("migration offsets %d, %d: want >= 30 and >= 90 (the kill points)", m[0].Offset, m[1].Offset)
	}
}

// TestAllWorkersDead kills every worker mid-request. With nowhere to migrate,
// a stream ends with a clean error event (no [DONE]) and a non-streaming
// request gets a 500 with an OpenAI error body, both within a bound; a request
// arriving afterwards gets 503 with Retry-After.
func TestAllWorkersDead(t *testing.T) {
	t.Parallel()
	s, fe, ids := faultStack(t, faultOpts{workers: 2, advisory: true, frontendArgs: []string{"--migration-limit", "3"}})
	killAll := func() {
		for _, id := range ids {
			if p := s.workers[id]; !p.Exited() {
				p.signal(syscall.SIGKILL)
			}
		}
	}

	// A non-streaming request, killed once it has produced 20 tokens.
	type result struct {
		resp *http.Response
		err  error
	}
	unary := make(chan result, 1)
	go func() {
		resp, err := tryPost(context.Background(), fe.url+"/v1/completions", completion("all dead unary", 300), map[string]string{"X-Request-Id": "dead-unary"})
		unary <- result{resp, err}
	}()
	waitFor(t, 10*time.Second, "dead-unary to produce 20 tokens", func() bool {
		resp, err := http.Get(fe.url + "/v1/requests/dead-unary")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var st requestState
		return resp.StatusCode == 200 && json.NewDecoder(resp.Body).Decode(&st) == nil && st.TokensGenerated >= 20
	})
	// A stream, killed at the same moment.
	prompt := "all workers dead"
	var killedAt time.Time
	res, _ := streamWithin(t, 20*time.Second, fe, "dead", completion(prompt, 300), onOffset(20, func() {
		killedAt = time.Now()
		killAll()
	}))
	if took := time.Since(killedAt); took > 10*time.Second {
		t.Errorf("the stream ended %v after the last worker died, want a prompt error", took)
	}
	checkCleanError(t, res, prompt, 300)
	var ev struct {
		Error apiErrorBody `json:"error"`
	}
	if err := json.Unmarshal([]byte(res.errorBody), &ev); err != nil || ev.Error.Message == "" || ev.Error.Code == "" {
		t.Errorf("error event %q: want an OpenAI error with message and code (%v)", res.errorBody, err)
	}

	var resp *http.Response
	select {
	case r := <-unary:
		if r.err != nil {
			t.Fatalf("non-streaming request: %v", r.err)
		}
		resp = r.resp
	case <-time.After(15 * time.Second):
		t.Fatal("the non-streaming request did not end after every worker died")
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var eb struct {
		Error *apiErrorBody `json:"error"`
	}
	if resp.StatusCode != http.StatusInternalServerError || json.Unmarshal(body, &eb) != nil || eb.Error == nil {
		t.Fatalf("non-streaming: status %d body %s, want 500 with an OpenAI error", resp.StatusCode, body)
	}
	if !strings.Contains(eb.Error.Message, "worker") || eb.Error.Code == "" || eb.Error.Type == "" {
		t.Errorf("non-streaming error %+v: want a message naming the cause, a code and a type", *eb.Error)
	}
	t.Logf("stream error: %s; unary error: %s", res.errorBody, body)

	// Once discovery is empty, a new request is refused with 503 and Retry-After.
	waitFor(t, 10*time.Second, "no routable worker", func() bool {
		ws, err := fe.workers()
		return err == nil && len(ws) == 0
	})
	r := post(t, fe.url+"/v1/completions", completion("after the end", 10), nil)
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
		t.Errorf("request with no worker alive: status %d Retry-After %q body %s, want 503 with Retry-After",
			r.StatusCode, r.Header.Get("Retry-After"), b)
	}
}

// TestZombieWorker pauses the serving worker until its request has migrated,
// then resumes it while the continuation still streams. The zombie may go on
// writing tokens to its own (fenced) attempt subject, but none of them reaches
// the client, and the request's state holds exactly max_tokens tokens.
func TestZombieWorker(t *testing.T) {
	for _, tc := range []struct {
		name       string
		workerArgs []string
		feArgs     []string
	}{
		{"stall_timeout", nil, []string{"--stall-timeout", "1s"}},
		{"lease_expiry", []string{"--lease-ttl", "2s"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, fe, _ := faultStack(t, faultOpts{workers: 2, workerArgs: tc.workerArgs,
				frontendArgs: append([]string{"--migration-limit", "3"}, tc.feArgs...)})
			prompt := "zombie " + tc.name
			const maxTokens = 200
			var zombie *proc
			stopAt := -1
			res, _ := streamWithin(t, 30*time.Second, fe, "zombie", completion(prompt, maxTokens), func(e sseEvent) {
				off, _ := strconv.Atoi(e.id)
				switch {
				case zombie == nil && off >= 20:
					zombie, stopAt = s.workers[fe.servingWorker(t, "zombie")], off
					zombie.signal(syscall.SIGSTOP)
				case zombie != nil && off > stopAt && stopAt >= 0 && len(fe.state(t, "zombie").Migrations) > 0:
					// The continuation streams: the request migrated. Wake the
					// zombie while the stream is still running. (Tokens past
					// the stop can also be ones the zombie sent just before
					// it: those do not count, only a recorded migration does.)
					stopAt = -1
					zombie.signal(syscall.SIGCONT)
				}
			})
			checkComplete(t, res, prompt, maxTokens)
			if stopAt != -1 {
				t.Fatalf("the stream never continued after the stop")
			}
			st := fe.state(t, "zombie")
			checkMigrated(t, st, 1, events.MigrationOngoingRequest)
			// How much did the zombie write past its cut? Informational: it
			// races with the migrated event that tells it to stop.
			late := zombieTokens(t, s, "zombie", st.Migrations[0].Offset)
			t.Logf("zombie stored %d tokens past the cut at %d", late, st.Migrations[0].Offset)
		})
	}
}

// zombieTokens counts the tokens attempt 0 of request id stored at or past
// offset cut, after the final event of the request.
func zombieTokens(t *testing.T, s *stack, id string, cut int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n := 0
	for e, err := range readLog(ctx, t, s.jetStream(t), id) {
		if err != nil {
			t.Fatalf("read %s: %v", id, err)
		}
		if tg, ok := e.Event.(events.TokensGenerated); ok && tg.Attempt == 0 && tg.Offset+len(tg.Tokens) > cut {
			n += tg.Offset + len(tg.Tokens) - max(cut, tg.Offset)
		}
	}
	return n
}
