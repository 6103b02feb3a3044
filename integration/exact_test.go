package integration

import (
	"encoding/json"
	"strings"
	"testing"
)

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
			if same := res.text == want; same != tc.exact {
				t.Errorf("answer equals the fault-free one: %v, want %v\n got %q\nwant %q", same, tc.exact, res.text, want)
			}
			if exact, ok := finalMark(t, res); !ok || exact != tc.exact {
				t.Errorf("final chunk's baton.exact = %v (present %v), want %v", exact, ok, tc.exact)
			}
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
	res, killed := killMidAnswer(t, s, fe, "exact-only", body, 5, func() {
		s.openaiWorker("oa2", simB)
		fe.waitRoutable(t, "oa2")
	})
	if killed != "oa1" {
		t.Fatalf("served by %q, want oa1", killed)
	}
	if res.done || !strings.Contains(res.errorBody, "exactly") {
		t.Fatalf("done %v, error %q; want an error event about continuing exactly and no [DONE]", res.done, res.errorBody)
	}
	st := fe.state(t, "exact-only")
	if st.Status != "failed" {
		t.Errorf("status %q, want failed", st.Status)
	}
	for _, g := range simB.generations(t) {
		if g.Body["continue_final_message"] == true {
			t.Errorf("a prefill was sent under --migration-exact-only: %v", g.Body)
		}
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
			if same := res.text == want; same != tc.exact {
				t.Errorf("answer equals the fault-free one: %v, want %v\n got %q\nwant %q", same, tc.exact, res.text, want)
			}
			if exact, ok := finalMark(t, res); !ok || exact != tc.exact {
				t.Errorf("final chunk's baton.exact = %v (present %v), want %v", exact, ok, tc.exact)
			}
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
