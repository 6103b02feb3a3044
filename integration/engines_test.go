package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// simProc is a running vLLM simulator (cmd/vllmsim).
type simProc struct {
	*proc
	url string
}

// startSim starts a simulator serving model "sim" with extra args and waits
// until it answers /health.
func startSim(t testing.TB, name string, args ...string) *simProc {
	t.Helper()
	port := freePort(t)
	all := append([]string{"--port", strconv.Itoa(port), "--model", "sim"}, args...)
	s := &simProc{proc: startBin(t, vllmsimBin, name, nil, all...), url: "http://127.0.0.1:" + strconv.Itoa(port)}
	waitFor(t, 20*time.Second, name+" to serve", func() bool {
		resp, err := http.Get(s.url + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	return s
}

// simRecord is a request the simulator received.
type simRecord struct {
	Path  string         `json:"path"`
	Fault string         `json:"fault"`
	Body  map[string]any `json:"body"`
}

func (s *simProc) records(t testing.TB) []simRecord {
	t.Helper()
	var recs []simRecord
	getJSON(t, s.url+"/sim/requests", 200, &recs)
	return recs
}

// generations are the records of real requests: not the workers' probes
// (max_tokens 1).
func (s *simProc) generations(t testing.TB) []simRecord {
	t.Helper()
	var out []simRecord
	for _, r := range s.records(t) {
		if r.Body["max_tokens"] != 1.0 {
			out = append(out, r)
		}
	}
	return out
}

// openaiWorker starts a worker with the OpenAI engine in front of sim,
// serving model "sim".
func (s *stack) openaiWorker(id string, sim *simProc, args ...string) *proc {
	s.t.Helper()
	return s.worker(id, append([]string{"--engine", "openai", "--openai-url", sim.url, "--model", "sim"}, args...)...)
}

// attemptState is an attempt in GET /v1/requests/{id}.
type attemptState struct {
	Attempt     int    `json:"attempt"`
	WorkerID    string `json:"worker_id"`
	CloseReason string `json:"close_reason"`
	Failure     *struct {
		Class        string `json:"class"`
		Status       int    `json:"status"`
		Code         string `json:"code"`
		Message      string `json:"message"`
		RetryAfterMS int64  `json:"retry_after_ms"`
	} `json:"failure"`
}

type engineState struct {
	Status     string         `json:"status"`
	Attempts   []attemptState `json:"attempts"`
	Migrations []struct {
		MigrationType string `json:"migration_type"`
	} `json:"migrations"`
	Error *struct {
		Message string `json:"message"`
		Code    string `json:"code"`
	} `json:"error"`
}

func (f *frontend) engineState(t testing.TB, id string) engineState {
	t.Helper()
	var st engineState
	getJSON(t, f.url+"/v1/requests/"+id, 200, &st)
	return st
}

func chatRequest(content string, maxTokens int, extra map[string]any) map[string]any {
	b := map[string]any{"model": "sim", "messages": []map[string]any{{"role": "user", "content": content}}, "max_tokens": maxTokens}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

// TestEngineFailureClasses runs each upstream failure of issue 9's table
// through baton and two OpenAI-engine workers sharing one simulator, the
// fault scripted in the request body (vllmsim_fault, passed through): a
// client error reaches the client with the upstream's status, code and
// message and nothing migrates; 429/503/404 migrate as new_request, with
// the upstream's Retry-After in the log; 5xx, cut, malformed and truncated
// streams and a first-token timeout migrate as ongoing_request, and the
// answer equals the fault-free one.
func TestEngineFailureClasses(t *testing.T) {
	sim := startSim(t, "sim", "--greedy", "--token-delay", "5ms")
	s := newStack(t)
	// No local inhibition: each case starts with both workers routable.
	fe := s.frontend([]string{"DYN_RUNTIME_INHIBITED_DURATION_SECS=0"}, "--migration-limit", "3")
	s.openaiWorker("oa1", sim, "--first-token-timeout", "2s")
	s.openaiWorker("oa2", sim, "--first-token-timeout", "2s")
	fe.waitRoutable(t, "oa1", "oa2")

	const maxTokens = 12
	clean := postStream(t, fe.url, "/v1/chat/completions", chatRequest("the failure table", maxTokens,
		map[string]any{"stream_options": map[string]any{"include_usage": true}}), nil, nil)
	if !clean.done || clean.finish != "length" || clean.text == "" {
		t.Fatalf("fault-free run: %+v", clean)
	}
	checkUsage(t, sim, clean, maxTokens)

	for i, tc := range []struct {
		spec      string
		stream    bool
		status    int // client-visible HTTP status; 200: the answer completes
		code      string
		migration string
		class     string
		upStatus  int
		retryMS   int64
		message   string
	}{
		{spec: "policy", stream: true, status: 400, code: "content_policy_violation", class: "client_error", upStatus: 400, message: "safety"},
		{spec: "policy", stream: false, status: 400, code: "content_policy_violation", class: "client_error", upStatus: 400, message: "safety"},
		{spec: "context", stream: true, status: 400, class: "client_error", upStatus: 400, message: "maximum context length"},
		{spec: "429:2", stream: true, status: 200, migration: "new_request", class: "upstream_unavailable", upStatus: 429, retryMS: 2000},
		{spec: "503", stream: false, status: 200, migration: "new_request", class: "upstream_unavailable", upStatus: 503},
		{spec: "404", stream: true, status: 200, migration: "new_request", class: "worker_not_ready", upStatus: 404},
		{spec: "500", stream: true, status: 200, migration: "ongoing_request", upStatus: 500},
		{spec: "500@3", stream: true, status: 200, migration: "ongoing_request", upStatus: 500},
		{spec: "cut@4", stream: true, status: 200, migration: "ongoing_request", message: "read stream"},
		{spec: "malformed@2", stream: true, status: 200, migration: "ongoing_request", message: "malformed"},
		{spec: "nodone@5", stream: true, status: 200, migration: "ongoing_request", message: "without a finish reason"},
		{spec: "stall", stream: true, status: 200, migration: "ongoing_request", message: "first token"},
	} {
		t.Run(fmt.Sprintf("%s stream=%v", tc.spec, tc.stream), func(t *testing.T) {
			fe.waitRoutable(t, "oa1", "oa2") // a 404 takes a worker out until its next probe
			id := fmt.Sprintf("class-%d", i)
			body := chatRequest("the failure table", maxTokens, map[string]any{
				"vllmsim_fault": map[string]any{"spec": tc.spec, "key": id}})
			var status int
			var text, errBody string
			if tc.stream {
				res := postStream(t, fe.url, "/v1/chat/completions", body, map[string]string{"X-Request-Id": id}, nil)
				status, text, errBody = res.status, res.text, res.errorBody
				if tc.status == 200 && (!res.done || res.errorBody != "") {
					t.Fatalf("stream did not complete: %+v", res)
				}
			} else {
				resp := post(t, fe.url+"/v1/chat/completions", body, map[string]string{"X-Request-Id": id})
				var out struct {
					Choices []struct {
						Message struct {
							Content string `json:"content"`
						} `json:"message"`
					} `json:"choices"`
				}
				raw := new(strings.Builder)
				_ = json.NewDecoder(teeReader(resp, raw)).Decode(&out)
				resp.Body.Close()
				status, errBody = resp.StatusCode, raw.String()
				if len(out.Choices) > 0 {
					text = out.Choices[0].Message.Content
				}
			}
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, errBody)
			}
			st := fe.engineState(t, id)
			if tc.status != 200 {
				var e struct {
					Error struct {
						Message, Type, Code string
					} `json:"error"`
				}
				_ = json.Unmarshal([]byte(errBody), &e)
				if (tc.code != "" && e.Error.Code != tc.code) || !strings.Contains(e.Error.Message, tc.message) || e.Error.Type != "invalid_request_error" {
					t.Errorf("error %s, want code %q and a message with %q", errBody, tc.code, tc.message)
				}
				if len(st.Migrations) != 0 || st.Status != "failed" {
					t.Errorf("state %+v, want failed without migrations", st)
				}
			} else {
				if text != clean.text {
					t.Errorf("answer %q, want the fault-free %q", text, clean.text)
				}
				if len(st.Migrations) != 1 || st.Migrations[0].MigrationType != tc.migration {
					t.Errorf("migrations %+v, want one %s", st.Migrations, tc.migration)
				}
			}
			f := st.Attempts[0].Failure
			if f == nil || f.Class != tc.class || f.Status != tc.upStatus || f.RetryAfterMS != tc.retryMS || !strings.Contains(f.Message, tc.message) {
				t.Errorf("attempt 0 failure %+v, want class %q status %d retry %d ms, message with %q", f, tc.class, tc.upStatus, tc.retryMS, tc.message)
			}
		})
	}
	for _, p := range []*proc{s.workers["oa1"], s.workers["oa2"]} {
		if !p.running() {
			t.Errorf("%s exited: no upstream error may end a worker", p.name)
		}
	}
}

// checkUsage: the usage chunk is the simulator's count of the prompt and of
// the answer.
func checkUsage(t *testing.T, sim *simProc, res sseResult, completion int) {
	t.Helper()
	var usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	}
	for _, e := range res.events {
		if strings.Contains(e.data, `"usage"`) {
			var c struct {
				Usage *json.RawMessage `json:"usage"`
			}
			_ = json.Unmarshal([]byte(e.data), &c)
			if c.Usage != nil {
				_ = json.Unmarshal(*c.Usage, &usage)
			}
		}
	}
	var tok struct {
		Count int `json:"count"`
	}
	resp := post(t, sim.url+"/tokenize", map[string]any{"model": "sim", "messages": []map[string]any{{"role": "user", "content": "the failure table"}}}, nil)
	_ = json.NewDecoder(resp.Body).Decode(&tok)
	resp.Body.Close()
	if usage.PromptTokens != tok.Count || usage.CompletionTokens != completion || tok.Count == 0 {
		t.Errorf("usage %+v, want the upstream's %d prompt tokens and %d completion tokens", usage, tok.Count, completion)
	}
}

type teeBody struct {
	r interface{ Read([]byte) (int, error) }
	w *strings.Builder
}

func (t teeBody) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	t.w.Write(p[:n])
	return n, err
}

func teeReader(resp *http.Response, w *strings.Builder) teeBody { return teeBody{r: resp.Body, w: w} }

