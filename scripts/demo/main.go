// Command demo shows a request migration at a human pace, end to end. It
// starts `baton up --fresh --migration-limit 3` with slow mock workers (an
// empty store of its own, on free ports), streams one completion and prints
// its text as it arrives, kills the serving worker with SIGKILL part-way
// through, and shows the stream carry on from the next token on the other
// worker: how long the client waited, the migration counter, `baton replay`
// of the request, and whether the text is exactly what an undisturbed run
// gives. Exits 1 if any of that did not happen.
//
//	go run ./scripts/demo
//	go run ./scripts/demo -tokens-per-sec 5 -max-tokens 100 -kill-at 30
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/baton-dev/baton/internal/freeport"
	"github.com/baton-dev/baton/services/engine"
)

const requestID = "demo-1"
const prompt = "watch me survive"

type options struct {
	bin          string
	httpPort     int
	natsPort     int
	tokensPerSec float64
	maxTokens    int
	killAt       int
}

func main() {
	var o options
	flag.StringVar(&o.bin, "baton", "", "a built baton binary (default: go build ./cmd/baton into a temporary directory)")
	flag.IntVar(&o.httpPort, "http-port", 0, "the frontend's port (default: a free one)")
	flag.IntVar(&o.natsPort, "nats-port", 0, "the embedded NATS server's port (default: a free one)")
	flag.Float64Var(&o.tokensPerSec, "tokens-per-sec", 20, "the mock workers' decode rate")
	flag.IntVar(&o.maxTokens, "max-tokens", 200, "max_tokens of the demo request")
	flag.IntVar(&o.killAt, "kill-at", 60, "kill the serving worker after this many tokens")
	flag.Parse()
	if o.killAt <= 0 || o.killAt >= o.maxTokens || o.tokensPerSec <= 0 {
		fmt.Fprintln(os.Stderr, "demo: want 0 < -kill-at < -max-tokens and a positive -tokens-per-sec")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func say(w io.Writer, format string, args ...any) {
	fmt.Fprintf(w, "\n== "+format+"\n", args...)
}

func run(ctx context.Context, o options, out io.Writer) error {
	dir, err := os.MkdirTemp("", "baton-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if o.bin == "" {
		o.bin = filepath.Join(dir, "baton")
		if err := build(ctx, o.bin, out); err != nil {
			return err
		}
	}
	if o.httpPort == 0 {
		if o.httpPort, err = freeport.Get(); err != nil {
			return err
		}
	}
	base := "http://127.0.0.1:" + strconv.Itoa(o.httpPort)
	natsPort := o.natsPort
	if natsPort == 0 {
		if natsPort, err = freeport.Get(); err != nil {
			return err
		}
	}
	natsURL := "nats://127.0.0.1:" + strconv.Itoa(natsPort)

	exited, stop, err := startUp(o, natsPort, filepath.Join(dir, "data"), out)
	if err != nil {
		return err
	}
	defer stop()
	if err := waitReady(ctx, base, exited); err != nil {
		return err
	}

	say(out, "streaming request %s: %d tokens at %v tokens/s; the serving worker dies after %d",
		requestID, o.maxTokens, o.tokensPerSec, o.killAt)
	res, err := stream(ctx, o, base, out)
	if err != nil {
		return err
	}
	fmt.Fprintln(out)
	problems := res.check(o, out)

	say(out, "curl -s %s/metrics | grep migration_total", base)
	line, err := migrationLine(ctx, base)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, line)
	if !strings.HasSuffix(line, " 1") {
		problems = append(problems, "no migration counted")
	}

	say(out, "baton replay %s   # the same story, from the log alone", requestID)
	replay := exec.CommandContext(ctx, o.bin, "replay", requestID, "--nats", natsURL)
	replay.Stdout, replay.Stderr = out, os.Stderr
	if err := replay.Run(); err != nil {
		problems = append(problems, "baton replay: "+err.Error())
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// build builds the baton binary at bin from the repository's root.
func build(ctx context.Context, bin string, out io.Writer) error {
	say(out, "go build -o %s ./cmd/baton", bin)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/baton")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build baton (run the demo from the repository's root): %w", err)
	}
	return nil
}

// startUp starts `baton up` with its store under dataDir. exited is closed
// when it exits; stop interrupts it as Ctrl-C would and waits for it to exit,
// killing it after a minute.
func startUp(o options, natsPort int, dataDir string, out io.Writer) (exited <-chan struct{}, stop func(), err error) {
	args := []string{"up", "--fresh", "--migration-limit", "3", "--workers", "2",
		"--mock-tokens-per-sec", strconv.FormatFloat(o.tokensPerSec, 'f', -1, 64),
		"--http-port", strconv.Itoa(o.httpPort), "--nats-port", strconv.Itoa(natsPort), "--data-dir", dataDir}
	say(out, "baton %s", strings.Join(args, " "))
	up := exec.Command(o.bin, args...)
	up.Env = append(os.Environ(), "BATON_LOG_LEVEL=warn")
	up.Stdout, up.Stderr = out, os.Stderr
	if err := up.Start(); err != nil {
		return nil, nil, err
	}
	done := make(chan struct{})
	go func() { _ = up.Wait(); close(done) }()
	stop = func() {
		say(out, "stopping baton up (SIGINT, as Ctrl-C)")
		_ = up.Process.Signal(syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = up.Process.Kill()
			<-done
		}
	}
	return done, stop, nil
}

// result is the demo stream as its client saw it.
type result struct {
	text      string
	tokens    int
	done      bool
	killed    string        // the worker killed
	killedAt  int           // tokens received when it was killed
	newWorker string        // the worker that finished the request
	afterKill time.Duration // from the kill to the first token of another worker
	pause     time.Duration // between that token and the one before it
}

// check prints how the stream went through the kill and returns what went
// wrong: no [DONE], a text that differs from an undisturbed run's, or no move
// to another worker.
func (res result) check(o options, out io.Writer) []string {
	var problems []string
	say(out, "the stream paused at token %d: %v from the kill to the next token (on %s), %v between the tokens either side (the usual gap is %v)",
		res.killedAt, res.afterKill.Round(time.Millisecond), res.newWorker, res.pause.Round(time.Millisecond),
		(time.Duration(float64(time.Second) / o.tokensPerSec)).Round(time.Millisecond))
	want := engine.MockText(prompt, 0, o.maxTokens)
	same := res.text == want
	say(out, "finished with [DONE]: %v; %d tokens; identical to an undisturbed run: %v", res.done, res.tokens, same)
	if !res.done {
		problems = append(problems, "the stream did not end with [DONE]")
	}
	if !same {
		problems = append(problems, "the text differs from an undisturbed run")
	}
	if res.newWorker == "" || res.newWorker == res.killed {
		problems = append(problems, "the request did not move to another worker")
	}
	return problems
}

// stream sends the demo request, prints its text as it arrives, and kills
// the serving worker after o.killAt tokens.
func stream(ctx context.Context, o options, base string, out io.Writer) (result, error) {
	var res result
	body := fmt.Sprintf(`{"model":"mock","prompt":%q,"max_tokens":%d,"stream":true}`, prompt, o.maxTokens)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return res, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", requestID)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return res, fmt.Errorf("POST /v1/completions: %s: %s", resp.Status, b)
	}
	var text strings.Builder
	var last, killedAt time.Time
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	offset := 0 // the SSE id of the last event: tokens so far (a chunk may carry several)
	for sc.Scan() {
		if id, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
			offset, _ = strconv.Atoi(id)
			continue
		}
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			res.done = true
			break
		}
		var chunk struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return res, fmt.Errorf("bad chunk %q: %w", data, err)
		}
		if chunk.Error != nil {
			return res, fmt.Errorf("the stream ended with an error: %s", chunk.Error)
		}
		if len(chunk.Choices) == 0 || chunk.Choices[0].Text == "" {
			continue
		}
		now := time.Now()
		// The first token of another worker: tokens the killed worker
		// sent before it died may still arrive after the kill.
		if !killedAt.IsZero() && res.newWorker == "" {
			if w, _ := servingWorker(ctx, base); w != "" && w != res.killed {
				res.afterKill, res.pause, res.newWorker = now.Sub(killedAt), now.Sub(last), w
				fmt.Fprintf(out, "\n[... next token from %s, %v after the kill]\n", res.newWorker, res.afterKill.Round(time.Millisecond))
			}
		}
		last = now
		text.WriteString(chunk.Choices[0].Text)
		res.tokens = offset
		fmt.Fprint(out, chunk.Choices[0].Text)
		if res.tokens >= o.killAt && killedAt.IsZero() {
			id, pid, err := servingPID(ctx, base)
			if err != nil {
				return res, err
			}
			fmt.Fprintf(out, "\n[request %s runs on %s: kill -9 %d]\n", requestID, id, pid)
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				return res, fmt.Errorf("kill -9 %d: %w", pid, err)
			}
			res.killed, res.killedAt, killedAt = id, offset, time.Now()
		}
	}
	res.text = text.String()
	return res, sc.Err()
}

// getJSON decodes GET base+path into v.
func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func servingWorker(ctx context.Context, base string) (string, error) {
	var st struct {
		Worker string `json:"worker"`
	}
	err := getJSON(ctx, base+"/v1/requests/"+requestID, &st)
	return st.Worker, err
}

// servingPID is the id and process id of the worker serving the request.
func servingPID(ctx context.Context, base string) (string, int, error) {
	id, err := servingWorker(ctx, base)
	if err != nil {
		return "", 0, err
	}
	var ws struct {
		Data []struct {
			ID  string `json:"id"`
			PID int    `json:"pid"`
		} `json:"data"`
	}
	if err := getJSON(ctx, base+"/v1/workers", &ws); err != nil {
		return "", 0, err
	}
	for _, w := range ws.Data {
		if w.ID == id && w.PID > 0 {
			return id, w.PID, nil
		}
	}
	return "", 0, fmt.Errorf("worker %q of request %s not in /v1/workers", id, requestID)
}

// waitReady waits until the frontend is healthy with both workers ready.
func waitReady(ctx context.Context, base string, exited <-chan struct{}) error {
	deadline := time.After(60 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var ws struct {
			Data []struct {
				State string `json:"state"`
			} `json:"data"`
		}
		if err := getJSON(ctx, base+"/v1/workers", &ws); err == nil {
			ready := 0
			for _, w := range ws.Data {
				if w.State == "ready" {
					ready++
				}
			}
			if ready == 2 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-exited:
			return errors.New("baton up exited before it was ready")
		case <-deadline:
			return errors.New("baton up not ready with two workers after 60s")
		case <-tick.C:
		}
	}
}

// migrationLine is the migration counter's line of the frontend's metrics.
func migrationLine(ctx context.Context, base string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "dynamo_frontend_model_migration_total{") {
			return l, nil
		}
	}
	return "(no migration_total line)", sc.Err()
}
