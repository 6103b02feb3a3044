package integration

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/streams"
)

// TestPartitionedLogTools runs a request log of three partitions, asked for
// only by the frontend's BATON_REQUEST_PARTITIONS (the worker adopts it), with
// requests in every partition. The tools find each request from its id
// alone; `baton events` merges every partition; the console lists requests
// of all of them; a component that asks for another number of partitions
// exits 2 with the reason.
func TestPartitionedLogTools(t *testing.T) {
	s := newStack(t)
	fe := s.frontend([]string{"BATON_REQUEST_PARTITIONS=3"})
	s.worker("w1", "--mock-tokens-per-sec", "1000", "--mock-ttft", "1ms")
	fe.waitRoutable(t, "w1")
	s.checkPartitions(t, 3)
	parts := streams.Partitions(3)
	var ids []string
	for i := range parts.Count() {
		id := partitionedID(parts, "part", i)
		ids = append(ids, id)
		prompt := "partition " + id
		res := postStream(t, fe.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 8},
			map[string]string{"X-Request-Id": id}, nil)
		checkComplete(t, res, prompt, 8)
	}
	for _, id := range ids {
		out, errOut, code := runTool(t, batonBin, "replay", "--json", "--nats", s.natsURL, id)
		var doc struct {
			Stream string `json:"stream"`
			Output string `json:"output"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &doc) != nil {
			t.Fatalf("baton replay %s: exit %d: %s\n%s", id, code, errOut, out)
		}
		if doc.Stream != parts.StreamOf(id) || doc.Output != engine.MockText("partition "+id, 0, 8) {
			t.Errorf("replay %s: stream %q output %q; want %s and the mock's text", id, doc.Stream, doc.Output, parts.StreamOf(id))
		}
		out, errOut, code = runTool(t, batonBin, "events", "--request", id, "--nats", s.natsURL)
		short := "req." + strings.TrimPrefix(parts.StreamOf(id), "BATON_REQUESTS_")
		if code != 0 || !strings.Contains(out, short) || !strings.Contains(out, streams.RequestEvents(id)) {
			t.Errorf("baton events --request %s: exit %d, stderr %q, want lines of %s:\n%s", id, code, errOut, short, out)
		}
	}
	// The nats CLI finds a request's partition from its slot, as docs/internals.md says.
	nats := natsCLI(t)
	for _, id := range ids {
		out, errOut, code := runTool(t, nats, "--server", s.natsURL, "stream", "ls", "--names", "--subject", "baton.requests."+strconv.Itoa(streams.Slot(id))+".>")
		if code != 0 || strings.TrimSpace(out) != parts.StreamOf(id) {
			t.Errorf("nats stream ls --subject for %s: exit %d, stderr %q, got %q, want %s", id, code, errOut, out, parts.StreamOf(id))
		}
	}
	out, errOut, code := runTool(t, batonBin, "events", "--nats", s.natsURL)
	for _, id := range append(ids, "baton.workers.w1.events") {
		if code != 0 || !strings.Contains(out, id) {
			t.Errorf("baton events: exit %d, stderr %q, want %s in:\n%s", code, errOut, id, out)
		}
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	getJSON(t, fe.url+"/v1/console/requests", 200, &list)
	listed := map[string]bool{}
	for _, r := range list.Data {
		listed[r.ID] = true
	}
	for _, id := range ids {
		if !listed[id] {
			t.Errorf("the console lists %v, want %s (in %s) too", list.Data, id, parts.StreamOf(id))
		}
	}

	// Another number of partitions than the log's: exit 2, with the reason.
	// (A worker reads no request stream, not even its info, which would list
	// every request id: the frontends check the layout, issue 23.)
	for _, args := range [][]string{
		{"frontend", "--nats", s.natsURL, "--http-port", "0", "--request-partitions", "2"},
		{"frontend", "--nats", s.natsURL, "--http-port", "0", "--request-partitions", "1"},
	} {
		_, errOut, code := runTool(t, batonBin, args...)
		if code != 2 || !strings.Contains(errOut, "the request log on this server has 3 partition(s)") {
			t.Errorf("baton %s with %s: exit %d, stderr %q; want 2 and the layout", args[0], args[len(args)-1], code, errOut)
		}
	}
}
