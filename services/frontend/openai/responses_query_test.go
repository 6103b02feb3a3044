package openai

import (
	"net/url"
	"testing"
)

func TestResponseAfter(t *testing.T) {
	for _, tc := range []struct {
		name, header, query string
		want                int
		wantParam           string // the error's param; "-" accepts
	}{
		{name: "none", want: -1, wantParam: "-"},
		{name: "Last-Event-ID", header: "4", want: 4, wantParam: "-"},
		{name: "Last-Event-ID with spaces", header: " 2 ", want: 2, wantParam: "-"},
		{name: "starting_after wins", header: "4", query: "7", want: 7, wantParam: "-"},
		{name: "zero", query: "0", want: 0, wantParam: "-"},
		{name: "Last-Event-ID not a number", header: "x", wantParam: ""},
		{name: "Last-Event-ID negative", header: "-1", wantParam: ""},
		{name: "starting_after a fraction", query: "1.5", wantParam: "starting_after"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, perr := ResponseAfter(tc.header, tc.query)
			if tc.wantParam == "-" {
				if perr != nil || got != tc.want {
					t.Errorf("got %d, %v; want %d", got, perr, tc.want)
				}
				return
			}
			if perr == nil || perr.Status != 400 || perr.Code != "invalid_value" || perr.Param != tc.wantParam || got != -1 {
				t.Errorf("got %d, %+v; want -1 and a 400 invalid_value about %q", got, perr, tc.wantParam)
			}
		})
	}
}

func TestInputItemsQuery(t *testing.T) {
	for _, tc := range []struct {
		query     string
		wantOrder string
		wantLimit int
		wantParam string // "" accepts
	}{
		{query: "", wantOrder: "desc", wantLimit: 20},
		{query: "order=asc&limit=1", wantOrder: "asc", wantLimit: 1},
		{query: "limit=100", wantOrder: "desc", wantLimit: 100},
		{query: "limit=0", wantParam: "limit"},
		{query: "limit=101", wantParam: "limit"},
		{query: "limit=ten", wantParam: "limit"},
		{query: "order=up", wantParam: "order"},
	} {
		t.Run(tc.query, func(t *testing.T) {
			qs, err := url.ParseQuery(tc.query)
			if err != nil {
				t.Fatal(err)
			}
			order, limit, perr := InputItemsQuery(qs)
			if tc.wantParam != "" {
				if perr == nil || perr.Param != tc.wantParam || perr.Code != "invalid_value" {
					t.Errorf("got %q %d %v, want an invalid_value about %s", order, limit, perr, tc.wantParam)
				}
				return
			}
			if perr != nil || order != tc.wantOrder || limit != tc.wantLimit {
				t.Errorf("got %q %d %v, want %q %d", order, limit, perr, tc.wantOrder, tc.wantLimit)
			}
		})
	}
}
