package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// target is where one HTTP attempt goes: a frontend URL and, in the soak, the
// incarnation behind it (nil in -compose-check mode).
type target struct {
	url string
	inc *feInc
}

// count edits the counts of t's incarnation, if any, under its lock.
func (t target) count(edit func(*feInc)) {
	if t.inc != nil {
		t.inc.mu.Lock()
		edit(t.inc)
		t.inc.mu.Unlock()
	}
}

// outcome is one request as its client saw it.
type outcome struct {
	id, prompt string
	maxTokens  int
	// input, when set, makes the request a background response of that
	// input (its prompt is then the engine's, "user: <input>"); seq is the
	// last sequence number seen (-1: none).
	input string
	seq   int

	text     strings.Builder
	tokens   int    // tokens received, by the SSE ids
	done     bool   // ended with [DONE]
	errEvent string // the error event or error body that ended it
	status   int    // HTTP status of a terminal non-200 answer
	resumes  int    // GET .../stream answered
	cuts     int    // streams that ended with neither [DONE] nor an error
	retries  int    // 503s and unanswered attempts before the request was accepted
	unavail  int    // 503 answers (retried or not)
	problems []string
	gaveUp   string

	lastTok time.Time
	maxGap  time.Duration

	started, ended time.Time // the client's first try and its end
}

func (o *outcome) problem(format string, args ...any) {
	o.problems = append(o.problems, fmt.Sprintf(format, args...))
}

// httpClient has no overall timeout (streams are long); readStream enforces
// an idle timeout instead. It sends $BATON_API_KEY, if set, as the API key
// (the compose stack needs one).
var httpClient = &http.Client{Transport: withAPIKey{os.Getenv("BATON_API_KEY"), &http.Transport{
	MaxIdleConnsPerHost: 64, ResponseHeaderTimeout: 60 * time.Second, DisableCompression: true,
}}}

// withAPIKey adds "Authorization: Bearer key" to every request.
type withAPIKey struct {
	key  string
	next http.RoundTripper
}

func (t withAPIKey) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.key != "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+t.key)
	}
	return t.next.RoundTrip(r)
}

// idleTimeout ends a stream that delivers nothing for this long (a NATS
// leader election pauses streams for 5-7 s); the client then resumes.
const idleTimeout = 45 * time.Second

// runRequest runs one streaming completion the way a careful client does: it
// posts with its own X-Request-Id and X-Resumable; whenever the stream is cut
// without [DONE] or an error event it resumes from its last SSE id on
// whichever frontend pick returns; until the request is accepted it retries
// 503s. It gives up after budget.
func runRequest(ctx context.Context, pick func(try int) (target, error), o *outcome, budget time.Duration) {
	o.started = time.Now()
	defer func() { o.ended = time.Now() }()
	deadline := time.Now().Add(budget)
	var a attempts
	for try := 0; ; try++ {
		if time.Now().After(deadline) {
			o.gaveUp = fmt.Sprintf("no end after %v (%d tries)", budget, try)
			return
		}
		if try > 0 {
			time.Sleep(backoff(try))
		}
		t, err := pick(try)
		if err != nil {
			continue
		}
		if o.input != "" {
			if !a.accepted {
				if a.postResponse(ctx, pick, t, o) {
					return
				}
				if !a.accepted {
					continue
				}
			}
			if resumeResponse(ctx, t, o) {
				return
			}
			continue
		}
		if !a.accepted {
			if a.post(ctx, pick, t, o) {
				return
			}
			continue
		}
		if resume(ctx, t, o) {
			return
		}
	}
}

// attempts is what runRequest knows of its request between tries.
type attempts struct {
	accepted   bool // the log holds the request: resume it, do not post it again
	unanswered bool // a POST went unanswered: it may have been accepted
}

// lost notes a POST of o that got no answer: it may have got in all the
// same, so the log is asked (through any frontend).
func (a *attempts) lost(ctx context.Context, pick func(try int) (target, error), o *outcome) {
	a.unanswered = true
	o.retries++
	if exists, _ := probe(ctx, pick, o.id); exists {
		a.accepted = true
	}
}

// post posts the request through t and reads its stream if it is accepted.
// It reports whether the request has ended, in full or for good.
func (a *attempts) post(ctx context.Context, pick func(try int) (target, error), t target, o *outcome) bool {
	body, _ := json.Marshal(map[string]any{"model": "mock", "prompt": o.prompt, "max_tokens": o.maxTokens, "stream": true})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, t.url+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", o.id)
	req.Header.Set("X-Resumable", "true")
	if a.unanswered {
		t.count(func(c *feInc) { c.ambiguous++ }) // if an earlier POST was stored after all, this one attaches: a resume
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		a.lost(ctx, pick, o)
		return false
	}
	switch {
	case resp.StatusCode == http.StatusOK:
		a.accepted = true
		if o.readStream(resp) {
			return true
		}
		o.cuts++
	case resp.StatusCode == http.StatusServiceUnavailable:
		// Rejected at admission (nothing stored: retry), or accepted and
		// failed before its first token (stored: that is its end).
		msg := readBody(resp)
		o.retries++
		o.unavail++
		if exists, _ := probe(ctx, pick, o.id); exists {
			o.status, o.errEvent = resp.StatusCode, msg
			return true
		}
	default:
		o.status, o.errEvent = resp.StatusCode, readBody(resp)
		return true
	}
	return false
}

// resume resumes the request's stream through t after the tokens received.
// It reports whether the request has ended, in full or for good.
func resume(ctx context.Context, t target, o *outcome) bool {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, t.url+"/v1/requests/"+o.id+"/stream", nil)
	req.Header.Set("Last-Event-ID", strconv.Itoa(o.tokens))
	t.count(func(c *feInc) { c.resumeTry++ })
	resp, err := httpClient.Do(req)
	if err != nil {
		return false // that frontend is gone: try another
	}
	if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusBadRequest {
		// Not a resume the frontend counts (lookup or offset refused).
		o.problem("resume at %d on %s: %d %s", o.tokens, t.url, resp.StatusCode, readBody(resp))
		return false
	}
	o.resumes++
	t.count(func(c *feInc) { c.resumes++ })
	if resp.StatusCode != http.StatusOK {
		// A request that failed before its first token answers its error.
		o.status, o.errEvent = resp.StatusCode, readBody(resp)
		return true
	}
	if o.readStream(resp) {
		return true
	}
	o.cuts++
	return false
}

func backoff(try int) time.Duration {
	d := time.Duration(try) * 50 * time.Millisecond
	return min(d, 500*time.Millisecond)
}

func readBody(resp *http.Response) string {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return strings.TrimSpace(string(b))
}

// probe asks a frontend whether request id is in the log.
func probe(ctx context.Context, pick func(int) (target, error), id string) (bool, error) {
	for try := range 40 {
		t, err := pick(try + 1)
		if err == nil {
			st, code, err := getState(ctx, t.url, id)
			if err == nil && code == http.StatusNotFound {
				return false, nil
			}
			if err == nil && code == http.StatusOK && st.ID == id {
				return true, nil
			}
		}
		time.Sleep(backoff(try + 1))
	}
	return false, fmt.Errorf("no frontend answered about %s", id)
}

// requestState is the part of GET /v1/requests/{id} the soak reads.
type requestState struct {
	ID              string `json:"id"`
	Status          string `json:"status"`
	Worker          string `json:"worker"`
	TokensGenerated int    `json:"tokens_generated"`
	Failure         *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"failure"`
}

func getState(ctx context.Context, base, id string) (requestState, int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/requests/"+id, nil)
	resp, err := httpClient.Do(req)
	if err != nil {
		return requestState{}, 0, err
	}
	defer resp.Body.Close()
	var st requestState
	if resp.StatusCode == http.StatusOK {
		err = json.NewDecoder(resp.Body).Decode(&st)
	}
	return st, resp.StatusCode, err
}

// readStream reads one SSE response and reports whether the request ended
// ([DONE] or an error event). It checks, event by event, that the ids are
// token offsets: each advances from the previous by exactly the tokens the
// event carries, continuing from where the last stream of this request
// stopped.
func (o *outcome) readStream(resp *http.Response) bool {
	defer resp.Body.Close()
	idle := time.AfterFunc(idleTimeout, func() { resp.Body.Close() })
	defer idle.Stop()
	rd := bufio.NewReader(resp.Body)
	var id, data string
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			return false
		}
		idle.Reset(idleTimeout)
		line = strings.TrimRight(line, "\r\n")
		switch {
		case strings.HasPrefix(line, "id: "):
			id = line[4:]
		case strings.HasPrefix(line, "data: "):
			data = line[6:]
		case line == "" && data != "":
			ended := o.event(id, data)
			id, data = "", ""
			if ended {
				return true
			}
		}
	}
}

// event applies one SSE event and reports whether it ended the request.
func (o *outcome) event(id, data string) bool {
	if data == "[DONE]" {
		o.done = true
		return true
	}
	if strings.HasPrefix(data, `{"error"`) {
		o.errEvent = data
		return true
	}
	var chunk struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(data), &chunk); err != nil {
		o.problem("bad chunk %q: %v", data, err)
		return false
	}
	var text string
	for _, c := range chunk.Choices {
		text += c.Text
	}
	n, err := strconv.Atoi(id)
	if err != nil {
		o.problem("event without a numeric id: id %q data %q", id, data)
		return false
	}
	got := len(strings.Fields(text))
	if n != o.tokens+got {
		o.problem("id %d after offset %d with %d tokens in the event (lost or repeated tokens)", n, o.tokens, got)
	}
	if got > 0 {
		now := time.Now()
		if !o.lastTok.IsZero() {
			o.maxGap = max(o.maxGap, now.Sub(o.lastTok))
		}
		o.lastTok = now
	}
	o.tokens = n
	o.text.WriteString(text)
	return false
}
