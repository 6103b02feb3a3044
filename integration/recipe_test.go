package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// recipeBlocks returns the shell blocks of docs/deployment.md's section
// "A 3-node cluster with `baton nats`", continuation lines joined.
func recipeBlocks(t *testing.T) [][]string {
	t.Helper()
	doc, err := os.ReadFile("../docs/deployment.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(doc)
	start := strings.Index(s, "## A 3-node cluster with `baton nats`")
	end := strings.Index(s, "### Provisioning")
	if start < 0 || end < start {
		t.Fatal("docs/deployment.md has no cluster recipe section")
	}
	var blocks [][]string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(s[start:end], -1) {
		blocks = append(blocks, strings.Split(strings.TrimSpace(strings.ReplaceAll(m[1], "\\\n", " ")), "\n"))
	}
	if len(blocks) != 4 {
		t.Fatalf("the cluster recipe has %d shell blocks, want 4 (nodes, components, worker users, route certificates)", len(blocks))
	}
	return blocks
}

// TestClusterRecipe runs docs/deployment.md's cluster recipe as written, on
// 127.0.0.1-3 instead of 10.0.0.1-3 and in a temporary directory instead
// of /etc/baton and /var/lib/baton: the route certificates (openssl), the
// worker users file, three `baton nats` nodes with route authentication,
// route TLS and --worker-users, a frontend with API keys and TLS, and
// workers w1-w3 each as its own user. A request is answered over HTTPS, the
// streams are R3, and w1's credential cannot purge the log.
func TestClusterRecipe(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatalf("openssl: %v (the recipe makes its certificates with it)", err)
	}
	blocks := recipeBlocks(t)
	nodes, components, users, certs := blocks[0], blocks[1], blocks[2], blocks[3]
	dir := t.TempDir()
	etc := filepath.Join(dir, "etc")
	if err := os.MkdirAll(etc, 0o700); err != nil {
		t.Fatal(err)
	}
	local := func(line string) string {
		line = strings.ReplaceAll(line, "/etc/baton", etc)
		line = strings.ReplaceAll(line, "/var/lib/baton", filepath.Join(dir, "lib"))
		return regexp.MustCompile(`10\.0\.0\.(\d|\$n)`).ReplaceAllString(line, "127.0.0.$1")
	}
	env := []string{"PATH=" + filepath.Dir(batonBin) + ":" + os.Getenv("PATH")}
	bash := func(what, script string) {
		t.Helper()
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
		cmd.Dir, cmd.Env = etc, append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s\n%s", what, err, script, out)
		}
	}

	// The secrets the recipe reads, and the API's key and certificate.
	for name, value := range map[string]string{"sys-password": "sys-secret-0123456789", "route-password": "route-secret-0123456789",
		"client-password": "client-secret-0123456789", "api-keys": "alice sk-alice-0123456789\n"} {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(value), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	bash("the API's certificate", `openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=127.0.0.1 `+
		`-addext subjectAltName=IP:127.0.0.1 -keyout api.key -out api.pem 2>/dev/null`)
	bash("the route certificates", local(strings.Join(certs, "\n")))
	var usersLines []string
	for _, line := range users {
		if !strings.HasPrefix(line, "baton ") { // the last line points at the node commands
			usersLines = append(usersLines, local(line))
		}
	}
	bash("the worker users", strings.Join(usersLines, "\n"))

	// Three nodes, each the first block with its own name, address and
	// files, and --worker-users as the third block says.
	var nodeScript []string
	for _, line := range nodes {
		if strings.HasPrefix(line, "baton nats ") {
			line, _, _ = strings.Cut(line, " #") // "and n2, n3 likewise"
			line = "exec " + line + " --worker-users " + filepath.Join(etc, "worker-users")
		}
		nodeScript = append(nodeScript, line)
	}
	for n := 1; n <= 3; n++ {
		script := local(strings.Join(nodeScript, "\n"))
		script = strings.ReplaceAll(script, "--host 0.0.0.0", "--host 127.0.0."+strconv.Itoa(n))
		script = regexp.MustCompile(`\bn1\b`).ReplaceAllString(script, "n"+strconv.Itoa(n))
		script = strings.ReplaceAll(script, "--store-dir "+filepath.Join(dir, "lib", "nats"), "--store-dir "+filepath.Join(dir, "lib", "nats-n"+strconv.Itoa(n)))
		startBin(t, "bash", "nats-n"+strconv.Itoa(n), env, "-c", script)
	}
	client := nats.UserInfo("baton", "client-secret-0123456789")
	natsURL := "nats://127.0.0.1:4222,nats://127.0.0.2:4222,nats://127.0.0.3:4222"
	waitFor(t, 60*time.Second, "the three nodes to form a JetStream cluster", func() bool {
		nc, err := nats.Connect(natsURL, client)
		if err != nil {
			return false
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err == nil
	})

	// The components: the second block, the frontend on a free port, the
	// worker line for w1, w2 and w3.
	var export, frontendLine, workerLine string
	for _, line := range components {
		switch {
		case strings.HasPrefix(line, "export "):
			export = line
		case strings.Contains(line, " baton frontend "):
			frontendLine = line
		case strings.Contains(line, " baton worker "):
			workerLine = line
		}
	}
	if export == "" || frontendLine == "" || workerLine == "" {
		t.Fatalf("the recipe's components block: %q", components)
	}
	port := freePort(t)
	fe := local(export + "\n" + strings.Replace(frontendLine, " baton frontend ", " exec baton frontend --http-port "+strconv.Itoa(port)+" ", 1))
	startBin(t, "bash", "frontend", env, "-c", fe)
	for _, w := range []string{"w1", "w2", "w3"} {
		line := strings.Replace(workerLine, " baton worker ", " exec baton worker ", 1)
		line = regexp.MustCompile(`\bw1\b`).ReplaceAllString(line, w)
		startBin(t, "bash", "worker-"+w, env, "-c", local(export+"\n"+line))
	}

	pem, err := os.ReadFile(filepath.Join(etc, "api.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	api := "https://127.0.0.1:" + strconv.Itoa(port)
	do := func(method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, api+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer sk-alice-0123456789")
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitFor(t, 60*time.Second, "w1, w2 and w3 ready behind the frontend", func() bool {
		code, body := do("GET", "/v1/workers", "")
		return code == 200 && strings.Count(body, `"state":"ready"`) == 3
	})
	code, body := do("POST", "/v1/completions", `{"model":"mock","prompt":"the recipe","max_tokens":8}`)
	var out struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &out) != nil || len(out.Choices) != 1 || len(strings.Fields(out.Choices[0].Text)) != 8 {
		t.Fatalf("a completion through the recipe's cluster: %d %s", code, body)
	}

	// R3, as --replicas 3 asked; and w1 is confined.
	nc, err := nats.Connect(natsURL, client)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, streams.RequestsStream)
	if err != nil {
		t.Fatal(err)
	}
	if r := st.CachedInfo().Config.Replicas; r != 3 {
		t.Errorf("%s has %d replicas, want 3", streams.RequestsStream, r)
	}
	wpass, err := exec.Command("awk", `$1 == "w1" {print $2}`, filepath.Join(etc, "worker-users")).Output()
	if err != nil {
		t.Fatal(err)
	}
	wc, err := nats.Connect(natsURL, nats.UserInfo("w1", strings.TrimSpace(string(wpass))), nats.CustomInboxPrefix(streams.WorkerInboxPrefix("w1")))
	if err != nil {
		t.Fatalf("w1's credential from the worker users file: %v", err)
	}
	defer wc.Close()
	if _, err := wc.Request("$JS.API.STREAM.PURGE."+streams.RequestsStream, nil, 2*time.Second); err == nil {
		t.Error("w1's credential purged the request log")
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs == 0 {
		t.Errorf("the request log after w1's purge attempt: %v, %+v", err, info)
	}
}
