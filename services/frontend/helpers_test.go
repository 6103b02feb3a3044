package frontend

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/baton-dev/baton/streams"
)

func TestParseOffset(t *testing.T) {
	cases := []struct {
		name     string
		header   string // Last-Event-ID
		query    string // starting_after
		want     int
		wantErr  bool
		wantName string // the field the error names
	}{
		{name: "none: from the start", want: 0},
		{name: "Last-Event-ID", header: "12", want: 12},
		{name: "Last-Event-ID with spaces", header: " 5 ", want: 5},
		{name: "starting_after", query: "7", want: 7},
		{name: "starting_after wins over Last-Event-ID", header: "3", query: "9", want: 9},
		{name: "zero", header: "0", want: 0},
		{name: "not a number", header: "abc", wantErr: true, wantName: headerLastEventID},
		{name: "a fraction", query: "1.5", wantErr: true, wantName: "starting_after"},
		{name: "negative", header: "-1", wantErr: true, wantName: headerLastEventID},
		{name: "negative starting_after", query: "-4", wantErr: true, wantName: "starting_after"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url := "/v1/requests/r1/resume"
			if tc.query != "" {
				url += "?starting_after=" + tc.query
			}
			r := httptest.NewRequest(http.MethodGet, url, nil)
			if tc.header != "" {
				r.Header.Set(headerLastEventID, tc.header)
			}
			got, err := parseOffset(r)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("got offset %d, want an error", got)
				}
				if err.status != http.StatusBadRequest || err.code != "invalid_offset" || !strings.Contains(err.message, tc.wantName) {
					t.Errorf("got %d %s %q, want 400 invalid_offset naming %s", err.status, err.code, err.message, tc.wantName)
				}
				return
			}
			if err != nil {
				t.Fatalf("got %v, want offset %d", err, tc.want)
			}
			if got != tc.want {
				t.Errorf("got offset %d, want %d", got, tc.want)
			}
		})
	}
}

func TestWriteLookupError(t *testing.T) {
	cases := []struct {
		name     string
		err      error
		want     int
		wantCode string
	}{
		{name: "not in the log: 404", err: streams.ErrNotFound, want: 404, wantCode: "request_not_found"},
		{name: "wrapped not found: 404", err: fmt.Errorf("read: %w", streams.ErrNotFound), want: 404, wantCode: "request_not_found"},
		{name: "the log unreadable: 500", err: errors.New("nats: timeout"), want: 500, wantCode: "log_unavailable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			writeLookupError(rec, "r1", tc.err)
			if rec.Code != tc.want || !strings.Contains(rec.Body.String(), `"code":"`+tc.wantCode+`"`) {
				t.Errorf("got %d %s, want %d with code %s", rec.Code, rec.Body, tc.want, tc.wantCode)
			}
		})
	}
}

func TestChildIDAndRequestType(t *testing.T) {
	if got := childID("req-1", 3); got != "req-1-3" {
		t.Errorf("got child id %q, want req-1-3", got)
	}
	if got, ok := childID("r", 0), streams.ValidID(childID("r", 0)); got != "r-0" || !ok {
		t.Errorf("got child id %q (valid %v), want a valid r-0", got, ok)
	}
	for stream, want := range map[bool]string{true: "stream", false: "unary"} {
		if got := requestType(stream); got != want {
			t.Errorf("requestType(%v): got %q, want %q", stream, got, want)
		}
	}
}
