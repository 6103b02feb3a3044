package natsserver

import (
	"strings"
	"testing"
)

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

// TestWorkerUsersForPartitions: `baton nats --request-partitions 3` gives
// each worker user the same pinned grants as one partition: none names a
// request stream (a worker neither creates one nor reads its info, issue 23).
func TestWorkerUsersForPartitions(t *testing.T) {
	c := Config{StoreDir: "x", User: "fe", Password: "fe-password-0123456", SysPassword: "s",
		WorkerUsers: []WorkerUser{{"w1", "w1-password-0123456"}}, RequestPartitions: 3}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	conf := c.configString()
	if !strings.Contains(conf, `"baton.dispatch.w1"`) {
		t.Errorf("the worker user's permissions lack its dispatches:\n%s", conf)
	}
	if strings.Contains(conf, "STREAM.INFO.BATON_REQUESTS") || strings.Contains(conf, "STREAM.CREATE") {
		t.Errorf("a worker user may read a request stream's info or create a stream:\n%s", conf)
	}
	c.RequestPartitions = 65
	if c.Validate() == nil {
		t.Error("65 request partitions validated")
	}
}
