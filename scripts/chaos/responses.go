package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// A share of the soak's traffic runs as background responses (OpenAI's
// Responses API): created with POST /v1/responses, background true, under
// the client's X-Request-Id, and read with GET
// /v1/responses/{id}?stream=true&starting_after=N, resumed on whichever
// frontend is up after the sequence number last seen. The checks are those
// of every request (the text equals a fault-free run's, the log agrees)
// plus the stream's: sequence numbers contiguous across every resume.

// responseShare: every responseShare-th request of a client is a response.
const responseShare = 4

// postResponse creates the background response of o through t. It reports
// whether the request has ended for good (a refusal that is its end).
func (a *attempts) postResponse(ctx context.Context, pick func(try int) (target, error), t target, o *outcome) bool {
	body, _ := json.Marshal(map[string]any{"model": "mock", "input": o.input, "max_output_tokens": o.maxTokens, "background": true})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, t.url+"/v1/responses", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", o.id)
	resp, err := httpClient.Do(req)
	if err != nil {
		a.lost(ctx, pick, o)
		return false
	}
	msg := readBody(resp)
	switch {
	case resp.StatusCode == http.StatusOK:
		a.accepted = true
	case resp.StatusCode == http.StatusServiceUnavailable:
		o.retries++
		if exists, _ := probe(ctx, pick, o.id); exists {
			a.accepted = true // accepted meanwhile: read its events
		}
	default:
		o.status, o.errEvent = resp.StatusCode, msg
		return true
	}
	return false
}

// resumeResponse reads o's events through t after the last sequence number
// seen. It reports whether the response has ended.
func resumeResponse(ctx context.Context, t target, o *outcome) bool {
	url := t.url + "/v1/responses/" + o.id + "?stream=true"
	if o.seq >= 0 {
		url += "&starting_after=" + strconv.Itoa(o.seq)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	t.count(func(c *feInc) { c.resumeTry++ })
	resp, err := httpClient.Do(req)
	if err != nil {
		return false
	}
	if resp.StatusCode != http.StatusOK {
		o.problem("resume after sequence number %d on %s: %d %s", o.seq, t.url, resp.StatusCode, readBody(resp))
		return false
	}
	o.resumes++
	t.count(func(c *feInc) { c.resumes++ })
	if o.readResponseEvents(resp) {
		return true
	}
	o.cuts++
	return false
}

// readResponseEvents reads one stream of response events and reports
// whether it ended with the response's terminal event, checking that each
// sequence number follows the last one seen.
func (o *outcome) readResponseEvents(resp *http.Response) bool {
	defer resp.Body.Close()
	idle := time.AfterFunc(idleTimeout, func() { resp.Body.Close() })
	defer idle.Stop()
	rd := bufio.NewReader(resp.Body)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			return false
		}
		idle.Reset(idleTimeout)
		data, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type     string `json:"type"`
			Seq      int    `json:"sequence_number"`
			Delta    string `json:"delta"`
			Response struct {
				Status     string `json:"status"`
				Incomplete *struct {
					Reason string `json:"reason"`
				} `json:"incomplete_details"`
			} `json:"response"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			o.problem("bad response event %q: %v", data, err)
			continue
		}
		if ev.Seq != o.seq+1 {
			o.problem("sequence number %d after %d (lost or repeated events)", ev.Seq, o.seq)
		}
		o.seq = ev.Seq
		switch ev.Type {
		case "response.output_text.delta":
			now := time.Now()
			if !o.lastTok.IsZero() {
				o.maxGap = max(o.maxGap, now.Sub(o.lastTok))
			}
			o.lastTok = now
			o.tokens++
			o.text.WriteString(ev.Delta)
		case "response.completed":
			o.done = true
			return true
		case "response.incomplete":
			if ev.Response.Status == "incomplete" && ev.Response.Incomplete != nil && ev.Response.Incomplete.Reason == "max_output_tokens" {
				o.done = true // the budget the soak asked for ended it
			} else {
				o.errEvent = data
			}
			return true
		case "response.failed", "error":
			o.errEvent = data
			return true
		}
	}
}
