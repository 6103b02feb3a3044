package frontend

import (
	"encoding/json"
	"testing"
)

func rawDetails(ds ...string) []json.RawMessage {
	out := make([]json.RawMessage, len(ds))
	for i, d := range ds {
		if d != "" {
			out[i] = json.RawMessage(d)
		}
	}
	return out
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
