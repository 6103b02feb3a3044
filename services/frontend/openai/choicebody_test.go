package openai

import (
	"encoding/json"
	"testing"
)

func TestChoiceBody(t *testing.T) {
	for _, tc := range []struct {
		body string
		i    int
		want string
	}{
		{`{"seed":7,"n":3,"x":{"y":1}}`, 2, `{"n":3,"seed":9,"x":{"y":1}}`},
		{`{"seed":7,"n":3}`, 0, `{"seed":7,"n":3}`},
		{`{"n":3}`, 1, `{"n":3}`},
		{`{"seed":null}`, 1, `{"seed":null}`},
	} {
		if got := string(ChoiceBody(json.RawMessage(tc.body), tc.i)); got != tc.want {
			t.Errorf("ChoiceBody(%s, %d) = %s, want %s", tc.body, tc.i, got, tc.want)
		}
	}
}
