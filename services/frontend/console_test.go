package frontend_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/services/frontend"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/streams"
	"github.com/prometheus/client_golang/prometheus"
)

func getBody(t *testing.T, req *http.Request) (int, http.Header, string) {
	t.Helper()
	resp, err := http.DefaultTransport.RoundTrip(req) // no redirects followed
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func get(t *testing.T, url string, header ...string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return getBody(t, req)
}

func TestConsolePageAndData(t *testing.T) {
	url := inProcess(t, engine.MockConfig{SpeedupRatio: 1e9})
	if code, h, _ := get(t, url+"/console"); code != http.StatusMovedPermanently || h.Get("Location") != "/console/" {
		t.Errorf("GET /console: status %d location %q, want 301 to /console/", code, h.Get("Location"))
	}
	for path, want := range map[string]string{"/console/": "<title>baton console</title>", "/console/console.js": "/v1/console/events", "/console/console.css": "--bg"} {
		if code, _, body := get(t, url+path); code != 200 || !strings.Contains(body, want) {
			t.Errorf("GET %s: status %d, body lacks %q", path, code, want)
		}
	}
	text, _ := stream(t, url, "console data", 12)

	var list struct {
		Data []struct {
			ID, Status, Model string
			Tokens, Attempts  int
		} `json:"data"`
	}
	code, _, body := get(t, url+"/v1/console/requests?model=mock&status=completed")
	if code != 200 || json.Unmarshal([]byte(body), &list) != nil || len(list.Data) != 1 {
		t.Fatalf("GET /v1/console/requests: status %d, body %s, want one completed request", code, body)
	}
	if r := list.Data[0]; r.Tokens != 12 || r.Attempts != 1 || r.Model != "mock" {
		t.Errorf("row %+v, want 12 tokens in 1 attempt of model mock", r)
	}
	id := list.Data[0].ID
	if _, _, body := get(t, url+"/v1/console/requests?status=running"); !strings.Contains(body, `"data":[]`) {
		t.Errorf("status=running lists %s, want none", body)
	}
	for _, q := range []string{"status=bogus", "limit=0", "limit=x"} {
		if code, _, body := get(t, url+"/v1/console/requests?"+q); code != 400 || !strings.Contains(body, `"error"`) {
			t.Errorf("?%s: status %d body %s, want a 400 error", q, code, body)
		}
	}

	var doc struct {
		Request struct {
			TokensGenerated int `json:"tokens_generated"`
		} `json:"request"`
		Timeline []struct {
			Type string `json:"type"`
			Len  int    `json:"len"`
		} `json:"timeline"`
		Output string `json:"output"`
	}
	code, _, body = get(t, url+"/v1/console/requests/"+id+"/timeline")
	if code != 200 || json.Unmarshal([]byte(body), &doc) != nil {
		t.Fatalf("timeline: status %d body %s", code, body)
	}
	if doc.Output != text || doc.Request.TokensGenerated != 12 || doc.Timeline[0].Type != "baton.request.accepted.v1" || doc.Timeline[len(doc.Timeline)-1].Len != 12 {
		t.Errorf("timeline: output %q (want %q), %d tokens, %d entries", doc.Output, text, doc.Request.TokensGenerated, len(doc.Timeline))
	}
	for _, bad := range []string{"nope", "bad.id"} {
		if code, _, body := get(t, url+"/v1/console/requests/"+bad+"/timeline"); code != 404 || !strings.Contains(body, "request_not_found") {
			t.Errorf("timeline of %q: status %d body %s, want 404 request_not_found", bad, code, body)
		}
	}
}

// feedEvent is one SSE event of /v1/console/events.
type feedEvent struct {
	id, event string
	data      map[string]any
}

// readFeed reads the console's event stream until until returns true.
func readFeed(t *testing.T, url, lastID string, until func(feedEvent) bool) []feedEvent {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url+"/v1/console/events", nil)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	timer := time.AfterFunc(20*time.Second, func() { resp.Body.Close() })
	defer timer.Stop()
	var out []feedEvent
	var cur feedEvent
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "id: "):
			cur.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			cur.event = line[7:]
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(line[6:]), &cur.data); err != nil {
				t.Fatalf("bad data %q: %v", line, err)
			}
		case line == "" && cur.event != "":
			out = append(out, cur)
			if until(cur) {
				return out
			}
			cur = feedEvent{}
		}
	}
	t.Fatalf("events ended before the condition held; got %d events", len(out))
	return nil
}

// killed starts a streaming request id and kills it through the API once
// it runs, so that a cancelled event reaches the feed.
func killed(t *testing.T, url, id string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions",
			strings.NewReader(`{"model":"mock","prompt":"kill me","max_tokens":500,"stream":true}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Request-Id", id)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, _, body := get(t, url+"/v1/requests/"+id); strings.Contains(body, `"status":"running"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("request %s never ran", id)
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := http.Post(url+"/v1/requests/"+id+"/cancel", "application/json", strings.NewReader(`{"mode":"kill"}`))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("cancel %s: %v %v", id, err, resp)
	}
	resp.Body.Close()
	<-done
}

func TestConsoleEventsResume(t *testing.T) {
	url := inProcess(t, engine.MockConfig{TokensPerSec: 20})
	if code, _, body := get(t, url+"/v1/console/events", "Last-Event-ID", "12"); code != 400 || !strings.Contains(body, "invalid_last_event_id") {
		t.Errorf("bad Last-Event-ID: status %d body %s, want 400 invalid_last_event_id", code, body)
	}
	cancelledOf := func(id string) func(e feedEvent) bool {
		return func(e feedEvent) bool {
			return e.event == "feed" && e.data["kind"] == "cancelled" && e.data["request_id"] == id
		}
	}
	killed(t, url, "r1")
	var sawCancel, sawState bool
	first := readFeed(t, url, "", func(e feedEvent) bool {
		sawCancel = sawCancel || cancelledOf("r1")(e)
		sawState = sawState || (e.event == "state" && len(e.data["workers"].([]any)) == 1)
		return sawCancel && sawState
	})
	var last feedEvent
	kinds := map[string]bool{}
	for _, e := range first {
		if e.event == "feed" {
			last = e
			kinds[e.data["kind"].(string)] = true
		}
	}
	for _, k := range []string{"registered", "cancelled"} {
		if !kinds[k] {
			t.Errorf("feed lacks a %q event: %v", k, kinds)
		}
	}
	if kinds["accepted"] || kinds["completed"] || kinds["tokens"] {
		t.Errorf("feed carries the events every request has: %v", kinds)
	}

	killed(t, url, "r2")
	resumed := readFeed(t, url, last.id, cancelledOf("r2"))
	for _, e := range resumed {
		if e.event != "feed" {
			continue
		}
		if e.data["kind"] == "registered" || e.data["request_id"] == "r1" {
			t.Errorf("resumed after %s but got %s (%v) again", last.id, e.id, e.data["summary"])
		}
	}
}

func TestConsoleCORSAndMetrics(t *testing.T) {
	url := inProcess(t, engine.MockConfig{SpeedupRatio: 1e9})
	preflight := func(origin string) (int, http.Header) {
		req, _ := http.NewRequest(http.MethodOptions, url+"/v1/requests/x/cancel", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
		code, h, _ := getBody(t, req)
		return code, h
	}
	if code, h := preflight(url); code != 204 || h.Get("Access-Control-Allow-Origin") != url || !strings.Contains(h.Get("Access-Control-Allow-Headers"), "Authorization") {
		t.Errorf("preflight from a frontend's origin: status %d, headers %v", code, h)
	}
	if _, h := preflight("http://evil.example:1234"); h.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("preflight from a foreign origin allowed: %v", h)
	}
	stream(t, url, "metrics", 3)
	_, _, body := get(t, url+"/metrics")
	for _, want := range []string{`baton_frontend_workers{model="mock",state="ready"} 1`, `baton_jetstream_stream_messages{stream="BATON_REQUESTS"}`, `baton_jetstream_stream_bytes{stream="BATON_WORKERS"}`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestConsoleEventsEndAtShutdown: an open console stream does not hold a
// frontend's shutdown for its graceful budget: it ends when draining starts.
func TestConsoleEventsEndAtShutdown(t *testing.T) {
	s := natstest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fe, err := frontend.New(s.Connect(t), nil, prometheus.NewRegistry(), frontend.Config{
		HTTPAddr: "127.0.0.1:0", Runtime: runner.Config{Streams: streams.Config{MemoryStorage: true}}, ShutdownTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	addr, err := fe.Listen()
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- fe.Run(ctx) }()
	url := "http://" + addr.String()
	var resp *http.Response
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err = http.Get(url + "/v1/console/events")
		if err == nil && resp.StatusCode == 200 {
			break
		}
		if err == nil {
			resp.Body.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("console events never answered: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer resp.Body.Close()
	start := time.Now()
	cancel()
	ended := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, resp.Body); close(ended) }()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the console stream outlived the shutdown's start by 10 s")
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the frontend did not stop within 10 s (budget 30 s) with a console open")
	}
	t.Logf("stream ended and frontend stopped %v after the shutdown began", time.Since(start))
}
