package engine_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
)

// TestPing: any HTTP answer is alive (a 401 too); a refused connection is
// dead; a server that takes the request and says nothing is hung
// (ErrNoAnswer).
func TestPing(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("Authorization") {
		case "Bearer hang":
			<-release
		case "":
			w.WriteHeader(http.StatusOK)
		default:
			w.WriteHeader(http.StatusUnauthorized)
		}
	}))
	defer srv.Close()
	defer close(release)
	ping := func(url, key string) error {
		e, err := engine.NewOpenAI(engine.OpenAIConfig{URL: url, Model: "m", APIKey: key})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		return e.Ping(ctx)
	}
	if err := ping(srv.URL, ""); err != nil {
		t.Errorf("200: %v, want alive", err)
	}
	if err := ping(srv.URL, "wrong"); err != nil {
		t.Errorf("401: %v, want alive (an answer)", err)
	}
	if err := ping(srv.URL, "hang"); !errors.Is(err, engine.ErrNoAnswer) {
		t.Errorf("no answer: %v, want ErrNoAnswer", err)
	}
	if err := ping("http://127.0.0.1:1", ""); err == nil || errors.Is(err, engine.ErrNoAnswer) {
		t.Errorf("refused: %v, want an error other than ErrNoAnswer", err)
	}
}
