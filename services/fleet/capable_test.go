package fleet

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

func withCaps(id string, c *events.Capabilities) projections.Worker {
	w := worker(id, "lease-"+id)
	w.Capabilities = c
	return w
}

func TestCapable(t *testing.T) {
	var (
		all      = withCaps("all", nil) // no capabilities reported: everything
		chat     = withCaps("chat", &events.Capabilities{Chat: true})
		chatPre  = withCaps("chat-prefill", &events.Capabilities{Chat: true, Prefill: true})
		compl    = withCaps("compl", &events.Capabilities{Completions: true})
		complIDs = withCaps("compl-ids", &events.Capabilities{Completions: true, TokenIDs: true})
		idsOnly  = withCaps("ids-only", &events.Capabilities{Chat: true, TokenIDs: true})
	)
	cases := []struct {
		name     string
		ws       []projections.Worker
		endpoint string
		start    int
		ids      bool
		want     []string
		wantErr  string // a substring; "" for none
	}{
		{name: "no workers is no error (the router says none)", endpoint: events.EndpointChat, want: nil},
		{name: "chat, first attempt", ws: []projections.Worker{all, chat, compl}, endpoint: events.EndpointChat,
			want: []string{"all", "chat"}},
		{name: "completions, first attempt", ws: []projections.Worker{all, chat, compl}, endpoint: events.EndpointCompletions,
			want: []string{"all", "compl"}},
		{name: "chat continuation needs prefill", ws: []projections.Worker{all, chat, chatPre}, endpoint: events.EndpointChat,
			start: 5, want: []string{"all", "chat-prefill"}},
		{name: "chat continuation by token ids runs on a completions engine with ids",
			ws: []projections.Worker{chat, complIDs}, endpoint: events.EndpointChat, start: 5, ids: true,
			want: nil, wantErr: "continue it at token 5"},
		{name: "chat continuation by ids on an engine serving chat with ids and completions",
			ws:       []projections.Worker{withCaps("both", &events.Capabilities{Chat: true, Completions: true, TokenIDs: true})},
			endpoint: events.EndpointChat, start: 5, ids: true, want: []string{"both"}},
		{name: "token ids without completions do not continue chat", ws: []projections.Worker{idsOnly},
			endpoint: events.EndpointChat, start: 2, ids: true, wantErr: "continue it at token 2"},
		{name: "completions continuation by prefill", ws: []projections.Worker{compl, complIDs},
			endpoint: events.EndpointCompletions, start: 3, want: []string{"compl", "compl-ids"}},
		{name: "completions continuation with unknown ids", ws: []projections.Worker{complIDs},
			endpoint: events.EndpointCompletions, start: 3, ids: false, want: []string{"compl-ids"}},
		{name: "none serves the endpoint", ws: []projections.Worker{chat, chatPre}, endpoint: events.EndpointCompletions,
			wantErr: "2 routable, none can serve " + events.EndpointCompletions},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := capable(tc.ws, tc.endpoint, tc.start, tc.ids)
			if tc.wantErr != "" {
				if !errors.Is(err, errNotCapable) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got err %v, want %v with %q", err, errNotCapable, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("got err %v, want none", err)
			}
			var ids []string
			for _, w := range got {
				ids = append(ids, w.ID)
			}
			if !slices.Equal(ids, tc.want) {
				t.Errorf("got %v, want %v", ids, tc.want)
			}
		})
	}
}

// TestCapableKeepsItsInput: filtering must not overwrite the caller's slice
// (discovery's snapshot).
func TestCapableKeepsItsInput(t *testing.T) {
	ws := []projections.Worker{withCaps("chat", &events.Capabilities{Chat: true}), withCaps("compl", &events.Capabilities{Completions: true})}
	if _, err := capable(ws, events.EndpointCompletions, 0, false); err != nil {
		t.Fatal(err)
	}
	if got := []string{ws[0].ID, ws[1].ID}; !slices.Equal(got, []string{"chat", "compl"}) {
		t.Errorf("got input %v after capable, want [chat compl]", got)
	}
}

func TestRouterInhibitDisabledAndExplicitDuration(t *testing.T) {
	w := worker("w1", "lease-1")
	cases := []struct {
		name    string
		window  time.Duration
		d       time.Duration
		advance time.Duration
		want    bool
	}{
		{name: "disabled: never inhibited", window: -1, d: time.Hour, advance: 0, want: false},
		{name: "explicit duration (Retry-After) outlasts the window", window: time.Second, d: 10 * time.Second,
			advance: 5 * time.Second, want: true},
		{name: "explicit duration ends", window: time.Second, d: 10 * time.Second, advance: 10 * time.Second, want: false},
		{name: "zero duration is the window", window: 2 * time.Second, d: 0, advance: 1999 * time.Millisecond, want: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			r := newRouter(Config{InhibitedDuration: tc.window}, func() time.Time { return now })
			r.inhibit(w, tc.d)
			now = now.Add(tc.advance)
			if got := r.isInhibited(w); got != tc.want {
				t.Errorf("got inhibited %v, want %v", got, tc.want)
			}
		})
	}
}
