package natsserver

import "testing"

func TestForPartitions(t *testing.T) {
	perms := `publish: [
  "baton.requests.>",
  "$JS.API.STREAM.INFO.BATON_REQUESTS", "$JS.API.STREAM.INFO.BATON_WORKERS",
  "$JS.API.DIRECT.GET.BATON_REQUESTS", "$JS.API.DIRECT.GET.BATON_REQUESTS.>",   # history
  "$JS.API.STREAM.MSG.GET.BATON_REQUESTS_OLD"
]`
	tests := []struct {
		n    int
		want string
	}{
		{1, perms},
		{2, `publish: [
  "baton.requests.>",
  "$JS.API.STREAM.INFO.BATON_REQUESTS", "$JS.API.STREAM.INFO.BATON_REQUESTS_0", "$JS.API.STREAM.INFO.BATON_REQUESTS_1", "$JS.API.STREAM.INFO.BATON_WORKERS",
  "$JS.API.DIRECT.GET.BATON_REQUESTS", "$JS.API.DIRECT.GET.BATON_REQUESTS_0", "$JS.API.DIRECT.GET.BATON_REQUESTS_1", "$JS.API.DIRECT.GET.BATON_REQUESTS.>", "$JS.API.DIRECT.GET.BATON_REQUESTS_0.>", "$JS.API.DIRECT.GET.BATON_REQUESTS_1.>",   # history
  "$JS.API.STREAM.MSG.GET.BATON_REQUESTS_OLD"
]`},
	}
	for _, tt := range tests {
		if got := ForPartitions(perms, tt.n); got != tt.want {
			t.Errorf("ForPartitions(%d):\n got %s\nwant %s", tt.n, got, tt.want)
		}
	}
}
