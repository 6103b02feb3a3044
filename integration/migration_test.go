package integration

import (
	"context"
	"encoding/json"
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

// Migration: the matrix of a stream moved at each point, and whether a
// migration through the OpenAI engine is token-exact and says so.

// servingWorker asks the frontend which worker serves request id now.
func (f *frontend) servingWorker(t testing.TB, id string) string {
	t.Helper()
	return f.state(t, id).Worker
}

// requestState is GET /v1/requests/{id}, with what the tests read of it.
type requestState struct {
	Status          string         `json:"status"`
	Worker          string         `json:"worker"`
	MaxTokens       int            `json:"max_tokens"`
	TokensGenerated int            `json:"tokens_generated"`
	FinishReason    string         `json:"finish_reason"`
	Attempts        []attemptState `json:"attempts"`
	Migrations      []struct {
		FromAttempt   int    `json:"from_attempt"`
		FromWorker    string `json:"from_worker"`
		MigrationType string `json:"migration_type"`
		Offset        int    `json:"offset"`
		Reason        string `json:"reason"`
	} `json:"migrations"`
	Error *apiErrorBody `json:"error"`
}

// attemptState is an attempt in GET /v1/requests/{id}.
type attemptState struct {
	Attempt      int    `json:"attempt"`
	WorkerID     string `json:"worker_id"`
	StartOffset  int    `json:"start_offset"`
	Closed       bool   `json:"closed"`
	Cut          int    `json:"cut"`
	CloseReason  string `json:"close_reason"`
	CloseClass   string `json:"close_class"`
	CloseStatus  int    `json:"close_status"`
	CloseCode    string `json:"close_code"`
	CloseMessage string `json:"close_message"`
	RetryAfterMS int64  `json:"retry_after_ms"`
}

// state is request id's GET /v1/requests/{id}.
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
	return streamFaults(t, fe, id, prompt, maxTokens, false, faultAt{afterTokens, func() { fault(fe.servingWorker(t, id)) }})
}

// faultAt is a fault of streamFaults: fault runs once, at the first event
// whose id (the offset of its last token) is token or more.
type faultAt struct {
	token int
	fault func()
}

// streamFaults streams a completion of maxTokens tokens for prompt from fe,
// as request id (resumable: with X-Resumable), and runs each of faults at
// its token, on the stream's goroutine.
func streamFaults(t *testing.T, fe *frontend, id, prompt string, maxTokens int, resumable bool, faults ...faultAt) sseResult {
	t.Helper()
	hdr := map[string]string{"X-Request-Id": id}
	if resumable {
		hdr["X-Resumable"] = "true"
	}
	once := make([]sync.Once, len(faults))
	return postStream(t, fe.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": maxTokens},
		hdr, func(e sseEvent) {
			n, err := strconv.Atoi(e.id)
			for i, f := range faults {
				if err == nil && n >= f.token {
					once[i].Do(f.fault)
				}
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

// checkExact checks an answer continued after a migration against the
// fault-free one, want: the same text when the continuation was exact, and
// its final chunk's baton.exact saying which it was.
func checkExact(t *testing.T, res sseResult, want string, exact bool) {
	t.Helper()
	if same := res.text == want; same != exact {
		t.Errorf("answer equals the fault-free one: %v, want %v\n got %q\nwant %q", same, exact, res.text, want)
	}
	if got, ok := finalMark(t, res); !ok || got != exact {
		t.Errorf("final chunk's baton.exact = %v (present %v), want %v", got, ok, exact)
	}
}

// finalMark is the "baton" field of a stream's last chunk (the one before
// [DONE]), and whether it had one.
func finalMark(t *testing.T, res sseResult) (exact, ok bool) {
	t.Helper()
	for i := len(res.events) - 1; i >= 0; i-- {
		data := res.events[i].data
		if data == "[DONE]" || data == "" {
			continue
		}
		var chunk struct {
			Baton *struct {
				Exact bool `json:"exact"`
			} `json:"baton"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			t.Fatalf("final chunk %q: %v", data, err)
		}
		if chunk.Baton == nil {
			return false, false
		}
		return chunk.Baton.Exact, true
	}
	return false, false
}

// TestEngineMigrationExactMarker: kill -9 of the serving worker mid-answer
// of a greedy chat, in front of two simulators. From token ids (the
// simulator's normal mode) the continuation is exact: the answer equals the
// fault-free one, and its final chunk and GET /v1/requests/{id} say
// exact:true. In front of simulators without token ids that re-tokenize a
// prefill as Ollama does (--retokenize-prefill), the continuation is
// prefill, the text diverges at the cut, and both say exact:false.
func TestEngineMigrationExactMarker(t *testing.T) {
	t.Parallel() // waits on the simulators' token delays, not on the CPU
	for _, tc := range []struct {
		name  string
		args  []string
		exact bool
	}{
		{name: "token ids", exact: true},
		{name: "re-tokenized prefill", args: []string{"--no-token-ids", "--retokenize-prefill", "8"}, exact: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"--token-delay", "40ms", "--greedy"}, tc.args...)
			simA, simB := startSim(t, "sim-a", args...), startSim(t, "sim-b", args...)
			body := chatRequest("tell me a long story about rivers", 30, map[string]any{"temperature": 0,
				"stream_options": map[string]any{"include_usage": true}})
			faultFree := directAsync(simA, body) // while the stack starts
			s := newStack(t)
			fe := s.frontend(nil, "--migration-limit", "2")
			s.openaiWorker("oa1", simA)
			s.openaiWorker("oa2", simB)
			fe.waitRoutable(t, "oa1", "oa2")
			want := faultFree(t) // before the stream, so that it is no generation of the stream's
			id := "exact-" + strings.ReplaceAll(tc.name, " ", "-")
			res, _ := killMidAnswer(t, s, fe, id, body, 12, nil)
			if !res.done || res.errorBody != "" {
				t.Fatalf("answer after the kill: done %v, error %s", res.done, res.errorBody)
			}
			checkExact(t, res, want, tc.exact)
			var st struct {
				Exact      *bool `json:"exact"`
				Migrations []struct {
					MigrationType string `json:"migration_type"`
				} `json:"migrations"`
				Attempts []struct {
					StartOffset int   `json:"start_offset"`
					Exact       *bool `json:"exact"`
				} `json:"attempts"`
			}
			getJSON(t, fe.url+"/v1/requests/"+id, 200, &st)
			if len(st.Migrations) != 1 || st.Exact == nil || *st.Exact != tc.exact {
				t.Fatalf("GET /v1/requests/%s: %d migrations, exact %v; want 1, %v", id, len(st.Migrations), st.Exact, tc.exact)
			}
			if last := st.Attempts[len(st.Attempts)-1]; last.StartOffset == 0 || last.Exact == nil || *last.Exact != tc.exact {
				t.Errorf("the continuation's attempt: start %d, exact %v; want > 0, %v", last.StartOffset, last.Exact, tc.exact)
			}
		})
	}
}

// TestEngineMigrationExactOnly: with --migration-exact-only, a continuation
// that could only be prefill (simulators without token ids) is not
// attempted: the stream ends with an error event and no [DONE], the
// reason in the log, and the other simulator is sent no prefill.
func TestEngineMigrationExactOnly(t *testing.T) {
	t.Parallel() // waits on the simulators' token delays, not on the CPU
	simA := startSim(t, "sim-a", "--token-delay", "40ms", "--greedy", "--no-token-ids")
	simB := startSim(t, "sim-b", "--token-delay", "40ms", "--greedy", "--no-token-ids")
	s := newStack(t)
	fe := s.frontend(nil, "--migration-limit", "2", "--migration-exact-only")
	s.openaiWorker("oa1", simA)
	fe.waitRoutable(t, "oa1")
	body := chatRequest("tell me a long story about rivers", 80, map[string]any{"temperature": 0}) // long enough to outlast oa2's start
	killWithNoContinuation(t, s, fe, simB, "exact-only", body, "exactly")
	if st := fe.state(t, "exact-only"); st.Status != "failed" {
		t.Errorf("status %q, want failed", st.Status)
	}
}

// TestEngineMigrationPrefillShownExact: the first attempt runs on a
// simulator with token ids (its prompt ids tell the prompt's length in the
// server's tokens), the continuation on one without, by prefill. The
// continuation's own prompt_tokens then decide: the prompt's plus the
// tokens so far on a server that takes the prefill back token for token
// (exact:true, and the fault-free text), more on one that re-tokenizes it
// as Ollama does (exact:false, and the text diverges).
func TestEngineMigrationPrefillShownExact(t *testing.T) {
	t.Parallel() // waits on the simulators' token delays, not on the CPU
	for _, tc := range []struct {
		name  string
		args  []string
		exact bool
	}{
		{name: "taken back token for token", exact: true},
		{name: "re-tokenized", args: []string{"--retokenize-prefill", "8"}, exact: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			simA := startSim(t, "sim-a", "--token-delay", "40ms", "--greedy")
			simB := startSim(t, "sim-b", append([]string{"--token-delay", "40ms", "--greedy", "--no-token-ids"}, tc.args...)...)
			body := chatRequest("tell me a long story about rivers", 80, map[string]any{"temperature": 0})
			faultFree := directAsync(simA, body) // while the stack starts
			s := newStack(t)
			fe := s.frontend(nil, "--migration-limit", "2")
			s.openaiWorker("oa1", simA)
			fe.waitRoutable(t, "oa1")
			want := faultFree(t) // before the stream, so that it is no generation of the stream's
			id := "shown-" + strings.ReplaceAll(tc.name, " ", "-")
			res, killed := killMidAnswer(t, s, fe, id, body, 12, func() {
				s.openaiWorker("oa2", simB)
				fe.waitRoutable(t, "oa2")
			})
			if killed != "oa1" || !res.done || res.errorBody != "" {
				t.Fatalf("killed %q; done %v, error %s; want oa1 killed and the answer done", killed, res.done, res.errorBody)
			}
			gens := simB.generations(t)
			if len(gens) == 0 || gens[len(gens)-1].Body["continue_final_message"] != true {
				t.Fatalf("the continuation was not a prefill: %v", gens)
			}
			checkExact(t, res, want, tc.exact)
			var st struct {
				Exact *bool `json:"exact"`
			}
			getJSON(t, fe.url+"/v1/requests/"+id, 200, &st)
			if st.Exact == nil || *st.Exact != tc.exact {
				t.Errorf("GET /v1/requests/%s: exact %v, want %v", id, st.Exact, tc.exact)
			}
		})
	}
}
