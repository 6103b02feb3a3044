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
// each worker user the partition streams' grants, pinned as before.
func TestWorkerUsersForPartitions(t *testing.T) {
	c := Config{StoreDir: "x", User: "fe", Password: "fe-password-0123456", SysPassword: "s",
		WorkerUsers: []WorkerUser{{"w1", "w1-password-0123456"}}, RequestPartitions: 3}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	conf := c.configString()
	for _, want := range []string{"BATON_REQUESTS_0", "BATON_REQUESTS_2", `"baton.dispatch.w1"`} {
		if !strings.Contains(conf, want) {
			t.Errorf("the worker user's permissions lack %s:\n%s", want, conf)
		}
	}
	c.RequestPartitions = 65
	if c.Validate() == nil {
		t.Error("65 request partitions validated")
	}
}
