package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/streams"
)

// servingWorker asks the frontend which worker serves request id now.
func (f *frontend) servingWorker(t testing.TB, id string) string {
	t.Helper()
	var st struct {
		Worker string `json:"worker"`
	}
	getJSON(t, f.url+"/v1/requests/"+id, 200, &st)
	return st.Worker
}

// requestState is the JSON of GET /v1/requests/{id}.
type requestState struct {
	Status     string `json:"status"`
	Worker     string `json:"worker"`
	Migrations []struct {
		MigrationType string `json:"migration_type"`
		FromWorker    string `json:"from_worker"`
		Offset        int    `json:"offset"`
	} `json:"migrations"`
	TokensGenerated int `json:"tokens_generated"`
}

func (f *frontend) state(t testing.TB, id string) requestState {
	t.Helper()
	var st requestState
	getJSON(t, f.url+"/v1/requests/"+id, 200, &st)
	return st
}

// faultAfter streams a completion of maxTokens tokens for prompt and calls
// fault(worker) with the serving worker once afterTokens tokens arrived.
func faultAfter(t *testing.T, fe *frontend, id, prompt string, maxTokens, afterTokens int, fault func(worker string)) sseResult {
	t.Helper()
	var once sync.Once
	return postStream(t, fe.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": maxTokens},
		map[string]string{"X-Request-Id": id}, func(e sseEvent) {
			if n, err := strconv.Atoi(e.id); err == nil && n >= afterTokens {
				once.Do(func() { fault(fe.servingWorker(t, id)) })
			}
		})
}

// checkComplete checks a stream that must have survived: the exact
// fault-free text, contiguous ids, [DONE].
func checkComplete(t *testing.T, res sseResult, prompt string, maxTokens int) {
	t.Helper()
	if res.status != 200 || !res.done || res.errorBody != "" {
		t.Fatalf("stream did not complete: status %d done %v error %s", res.status, res.done, res.errorBody)
	}
	if want := engine.MockText(prompt, 0, maxTokens); res.text != want {
		t.Fatalf("text differs from a fault-free run:\n got %q\nwant %q", res.text, want)
	}
	checkIDs(t, res, 0)
}

// checkCleanError checks a stream that could not survive: an error event, no
// [DONE], and only correct tokens before it.
func checkCleanError(t *testing.T, res sseResult, prompt string, maxTokens int) {
	t.Helper()
	if res.done {
		t.Fatalf("a failed stream ended with [DONE]")
	}
	if res.errorBody == "" {
		t.Fatalf("stream ended without an error event (status %d)", res.status)
	}
	if want := engine.MockText(prompt, 0, maxTokens); !strings.HasPrefix(want, res.text) {
		t.Fatalf("tokens before the error are not a prefix of the fault-free text:\n got %q\nwant %q", res.text, want)
	}
	checkIDs(t, res, 0)
}

// testPartitions is the request log's layout of the migration and resume
// tests: partitioned, while the other tests run with one partition.
const testPartitions = 3

// migrationStack starts NATS, a frontend with the given args (and the
// system-account URL for disconnect advisories if advisory is set), and n
// workers producing tokensPerSec tokens/s with a 1 s drain budget, on a
// request log of testPartitions partitions.
func migrationStack(t *testing.T, n, tokensPerSec int, advisory bool, workerArgs []string, frontendArgs ...string) (*stack, *frontend, []string) {
	t.Helper()
	s := newStack(t)
	s.partitions = testPartitions
	if advisory {
		frontendArgs = append(frontendArgs, "--nats-system-url", s.sysURL())
	}
	fe := s.frontend(nil, frontendArgs...)
	s.workerEnv = []string{"DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS=1"}
	var ids []string
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("w%d", i)
		s.worker(id, append([]string{"--mock-tokens-per-sec", strconv.Itoa(tokensPerSec), "--mock-ttft", "10ms"}, workerArgs...)...)
		ids = append(ids, id)
	}
	fe.waitRoutable(t, ids...)
	s.checkPartitions(t, testPartitions)
	return s, fe, ids
}

// checkPartitions checks that the server's request log has n partitions.
func (s *stack) checkPartitions(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got, err := streams.Discover(ctx, s.jetStream(t)); err != nil || got.Count() != n {
		t.Fatalf("the request log has %d partitions (%v), want %d", got, err, n)
	}
}

// sysURL is the system-account URL of the stack's server, with the password
// it generated at its first start.
func (s *stack) sysURL() string {
	s.t.Helper()
	pw, err := os.ReadFile(filepath.Join(s.dir, "nats", "sys-password"))
	if err != nil {
		s.t.Fatalf("the system-account password: %v", err)
	}
	return strings.Replace(s.natsURL, "nats://", "nats://sys:"+strings.TrimSpace(string(pw))+"@", 1)
}

// TestMigrationMatrix is Dynamo's own matrix: migration limit {3, 0} ×
// max-seq-len {unset, 1000000, 1} × worker fault {SIGKILL, SIGTERM}
// mid-stream. With limit 3 and max-seq-len other than 1 the request
// completes with the fault-free text; otherwise it ends with a clean error.
func TestMigrationMatrix(t *testing.T) {
	for _, limit := range []int{3, 0} {
		for _, maxSeq := range []string{"", "1000000", "1"} {
			for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
				name := fmt.Sprintf("limit=%d/max_seq_len=%s/%v", limit, maxSeq, sig)
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					args := []string{"--migration-limit", strconv.Itoa(limit)}
					if maxSeq != "" {
						args = append(args, "--migration-max-seq-len", maxSeq)
					}
					// At 50 tokens/s the request outlives the 1 s drain budget,
					// so SIGTERM hands it off mid-stream.
					s, fe, _ := migrationStack(t, 2, 50, true, nil, args...)
					prompt := "the quick brown fox " + name
					res := faultAfter(t, fe, "m", prompt, 120, 20, func(w string) {
						s.workers[w].signal(sig)
					})
					wantOK := limit == 3 && maxSeq != "1"
					if wantOK {
						checkComplete(t, res, prompt, 120)
					} else {
						checkCleanError(t, res, prompt, 120)
					}
					ongoing := fe.metric(t, "dynamo_frontend_model_migration_total", "model", "mock", "migration_type", "ongoing_request")
					if wantOK && ongoing < 1 {
						t.Errorf("ongoing_request migrations = %v, want >= 1", ongoing)
					}
					if !wantOK && ongoing != 0 {
						t.Errorf("ongoing_request migrations = %v, want 0", ongoing)
					}
					exceeded := fe.metric(t, "dynamo_frontend_model_migration_max_seq_len_exceeded_total", "model", "mock")
					if want := map[bool]float64{true: 1, false: 0}[maxSeq == "1"]; exceeded != want {
						t.Errorf("max_seq_len_exceeded = %v, want %v", exceeded, want)
					}
				})
			}
		}
	}
}
