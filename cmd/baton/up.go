package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/baton-dev/baton/services/frontend"
	"github.com/baton-dev/baton/services/natsserver"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"
)

const upSummary = `Runs the whole stack on one machine: an embedded NATS server with
JetStream (store under --data-dir), one frontend (in this process) and
--workers mock workers, each a child process of this one (so one can be
killed alone; a worker that exits is logged and the rest keep running).
Takes the frontend's flags and the worker's and mock engine's flags. The
frontend listens on 127.0.0.1 unless --http-host says otherwise; the store
persists across runs (an old X-Request-Id replays its old answer) unless
--fresh empties it.
Ctrl-C (SIGINT/SIGTERM) stops everything gracefully: the workers drain and
exit, then the frontend, then NATS. A second Ctrl-C exits at once.`

// workerStopMargin is how long past its drain budget a worker may take to
// exit before it is killed.
const workerStopMargin = 10 * time.Second

// upHTTPHost is where `baton up`'s frontend listens by default.
const upHTTPHost = "127.0.0.1"

// upOptions are the flags of `baton up`.
type upOptions struct {
	common     *commonFlags
	streams    *streamFlags
	fe         *frontendFlags
	w          *workerFlags
	dataDir    string
	fresh      bool
	natsPort   int
	natsUser   string
	natsPass   string
	workers    int
	systemPort int
	sys        natsserver.Config // system-account user and password
	cfg        frontend.Config
	// workerArgs are the flags passed through to every worker.
	workerArgs []string
}

func parseUp(env *environment, args []string) (*upOptions, error) {
	f := newFlagSet("up", upSummary, env.lookup, env.stdout)
	o := &upOptions{common: addCommonFlags(f)}
	f.StringVar(&o.dataDir, "data-dir", "./.baton", "`directory` of the NATS store (<dir>/nats)")
	f.IntVar(&o.natsPort, "nats-port", natsserver.DefaultPort, "NATS client `port`; -1 picks a free one")
	f.BoolVar(&o.fresh, "fresh", false, "start with an empty store: delete <data-dir>/nats first, the whole JetStream store (every stored request with its events and answer, the worker history, leases and load); nothing else under --data-dir is touched")
	f.StringVar(&o.natsUser, "user", "", "require this NATS `user` (with --password) on the embedded server; the frontend and workers log in with it")
	f.bindEnv("user", "BATON_NATS_USER", nil)
	f.StringVar(&o.natsPass, "password", "", "NATS `password` of --user")
	f.bindEnv("password", "BATON_NATS_PASSWORD", nil)
	f.IntVar(&o.workers, "workers", 2, "`number` of mock workers (child processes)")
	addSysFlags(f, &o.sys)
	f.IntVar(&o.systemPort, "system-port", 0, "first workers' status server `port` (/health, /live, /metrics): worker i listens on port+i-1; 0 off")
	f.bindEnv("system-port", "DYN_SYSTEM_PORT", nil)
	f.showDefault("system-port", "off")
	o.streams = addStreamFlags(f)
	o.fe = addFrontendFlags(f)
	// up is for one machine: loopback unless asked otherwise.
	o.fe.httpHost = upHTTPHost
	f.showDefault("http-host", upHTTPHost+"; 0.0.0.0 for all interfaces")
	o.w = addWorkerFlags(f)
	if err := f.parse(args); err != nil {
		return nil, err
	}
	var errs []error
	if o.workers < 0 {
		errs = append(errs, fmt.Errorf("--workers %d: must not be negative", o.workers))
	}
	if o.natsPort == 0 || o.natsPort < -1 || o.natsPort > 65535 {
		errs = append(errs, fmt.Errorf("--nats-port %d: want a port, or -1 for a free one", o.natsPort))
	}
	if o.fe.httpPort == 0 {
		errs = append(errs, errors.New("--http-port 0: up needs a fixed port"))
	}
	if o.dataDir == "" {
		errs = append(errs, errors.New("--data-dir: empty"))
	}
	if (o.natsUser == "") != (o.natsPass == "") {
		errs = append(errs, errors.New("--user and --password go together"))
	}
	if o.systemPort < 0 || o.systemPort > 65535 || (o.systemPort > 0 && o.systemPort+o.workers-1 > 65535) {
		errs = append(errs, fmt.Errorf("--system-port %d: the workers' ports must lie in 1-65535", o.systemPort))
	}
	if o.w.leaseTTL < time.Second {
		errs = append(errs, fmt.Errorf("--lease-ttl %v: want at least 1s", o.w.leaseTTL))
	}
	if err := o.w.check(env.lookup); err != nil {
		errs = append(errs, err)
	}
	cfg, err := o.fe.config(env.lookup, o.streams.config())
	if err != nil {
		errs = append(errs, err)
	}
	o.cfg = cfg
	if err := errors.Join(errs...); err != nil {
		return nil, usageError{err}
	}
	o.workerArgs = append([]string{"--log-level", o.common.logLevel.String()}, o.streams.args()...)
	pass := map[string]bool{}
	for _, name := range passThrough {
		pass[name] = true
	}
	f.Visit(func(fl *flag.Flag) {
		if pass[fl.Name] {
			o.workerArgs = append(o.workerArgs, "--"+fl.Name+"="+fl.Value.String())
		}
	})
	return o, nil
}

func runUp(ctx context.Context, env *environment, args []string) error {
	o, err := parseUp(env, args)
	if err != nil {
		return err
	}
	log := o.common.logger(env.stderr, "up")
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the baton executable: %w", err)
	}

	// Shutdown order, the reverse of startup: (1) SIGTERM the workers and
	// wait while they drain and hand off (bounded by their budget plus a
	// margin, then SIGKILL), so the frontend can still stream what they
	// finish; (2) stop the frontend, which lets open streams continue for
	// its graceful budget; (3) drain its NATS connection; (4) shut down
	// NATS, which everyone needs until the end.
	ns, err := o.startNATS(env, log)
	if err != nil {
		return err
	}
	defer func() {
		log.Info("stopping nats")
		ns.Shutdown()
		ns.WaitForShutdown()
	}()
	natsURL := ns.ClientURL()

	feLog := o.common.logger(env.stderr, "frontend")
	nc, err := connectNATS(ctx, natsURL, "baton-frontend", natsConnectTimeout, feLog, o.natsOptions()...)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer nc.close()
	fe, err := newFrontend(nc, feLog, o.cfg)
	if err != nil {
		return err
	}
	reloadKeysOnHangup(ctx, fe, feLog)

	// failed is cancelled when the frontend stops on its own: the stack
	// cannot serve, so it shuts down and exits 1.
	failed, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	feCtx, stopFrontend := context.WithCancel(context.WithoutCancel(ctx))
	defer stopFrontend()
	var feGroup errgroup.Group
	feGroup.Go(func() error { return runUpFrontend(feCtx, fe, fail) })

	wCtx, stopWorkers := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWorkers()
	var workers errgroup.Group
	pids := o.startWorkers(wCtx, &workers, env, log, exe, natsURL, fail)

	if failed.Err() == nil {
		if err := waitLive(failed, o.cfg.HTTPAddr); err == nil {
			printStack(env, o, natsURL, pids)
		}
	}
	<-failed.Done()

	log.Info("stopping workers", "count", len(pids))
	stopWorkers()
	_ = workers.Wait()
	log.Info("stopping frontend")
	stopFrontend()
	feErr := feGroup.Wait()
	if cause := context.Cause(failed); cause != nil && ctx.Err() == nil {
		return cause
	}
	if feErr != nil {
		return fmt.Errorf("frontend: %w", feErr)
	}
	return nil
}

// startNATS starts the embedded NATS server on <data-dir>/nats, emptied
// first under --fresh, and points the frontend's system-account connection
// at it unless --nats-system-url names another. The caller shuts it down.
func (o *upOptions) startNATS(env *environment, log *slog.Logger) (*server.Server, error) {
	storeDir := filepath.Join(o.dataDir, "nats")
	if o.fresh {
		if err := os.RemoveAll(storeDir); err != nil {
			return nil, fmt.Errorf("--fresh: %w", err)
		}
		log.Info("started with an empty store (--fresh)", "store", storeDir)
	}
	nsCfg := natsserver.Config{
		Port:     o.natsPort,
		StoreDir: storeDir,
		User:     o.natsUser,
		Password: o.natsPass,
		SysUser:  o.sys.SysUser, SysPassword: o.sys.SysPassword,
	}
	if _, err := nsCfg.ResolveSysPassword(); err != nil {
		return nil, err
	}
	ns, err := natsserver.Start(nsCfg, o.common.logger(env.stderr, "nats"))
	if err != nil {
		return nil, fmt.Errorf("start nats: %w", err)
	}
	if o.cfg.Fleet.SystemURL == "" {
		o.cfg.Fleet.SystemURL = natsserver.SysURL(ns.ClientURL(), nsCfg.SysUser, nsCfg.SysPassword)
	}
	return ns, nil
}

// runUpFrontend runs the frontend until ctx is done. If it stops before
// that, on its own, it calls fail with why, which stops the whole stack.
func runUpFrontend(ctx context.Context, fe *frontend.Frontend, fail context.CancelCauseFunc) error {
	err := fe.Run(ctx)
	if ctx.Err() == nil {
		if err == nil {
			err = errors.New("frontend stopped unexpectedly")
		}
		fail(err)
	}
	return err
}

// startWorkers starts the worker processes, each waited for (and its end
// logged) in group; cancelling ctx stops them. It returns the pids of those
// that started. If one fails to start, it calls fail and starts no more.
func (o *upOptions) startWorkers(ctx context.Context, group *errgroup.Group, env *environment, log *slog.Logger, exe, natsURL string, fail context.CancelCauseFunc) []int {
	pids := make([]int, 0, o.workers)
	for i := 1; i <= o.workers; i++ {
		id := upWorkerID(i)
		cmd := o.workerCommand(ctx, exe, i, natsURL, env)
		if err := cmd.Start(); err != nil {
			fail(fmt.Errorf("start worker %s: %w", id, err))
			break
		}
		pids = append(pids, cmd.Process.Pid)
		group.Go(func() error {
			waitWorker(ctx, log, id, cmd)
			return nil
		})
	}
	return pids
}

// workerCommand builds the child process of one worker. Cancelling ctx sends
// it SIGTERM; if it has not exited after its drain budget plus a margin, it
// is killed.
//
// The credentials travel in the environment, not on the command line, where
// any user of the machine could read them; --system-port is always explicit,
// so that a DYN_SYSTEM_PORT in up's environment does not give every worker
// the same port.
func (o *upOptions) workerCommand(ctx context.Context, exe string, i int, natsURL string, env *environment) *exec.Cmd {
	args := append([]string{"worker", "--nats", natsURL, "--worker-id", upWorkerID(i),
		"--system-port", strconv.Itoa(o.workerSystemPort(i))}, o.workerArgs...)
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = o.w.shutdownBudget + workerStopMargin
	cmd.Env = append(childEnv(os.Environ()), supervisorEnv+"="+strconv.Itoa(os.Getpid()))
	if o.natsUser != "" {
		cmd.Env = append(cmd.Env, "NATS_USER="+o.natsUser, "NATS_PASSWORD="+o.natsPass)
	}
	cmd.Stdout = env.stdout
	cmd.Stderr = env.stderr
	cmd.SysProcAttr = childProcAttr()
	return cmd
}

// childEnv is env without the connection variables of another NATS server
// (NATS_USER, NATS_CREDS, NATS_TLS_CA, ...): up's workers connect to up's
// embedded server, with up's credentials.
func childEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "NATS_") {
			out = append(out, kv)
		}
	}
	return out
}

// upWorkerID is the id of up's worker i (from 1).
func upWorkerID(i int) string { return "up-w" + strconv.Itoa(i) }

// workerSystemPort is the status server port of worker i (from 1), 0 off.
func (o *upOptions) workerSystemPort(i int) int {
	if o.systemPort == 0 {
		return 0
	}
	return o.systemPort + i - 1
}

// natsOptions are the frontend's credentials for the embedded server.
func (o *upOptions) natsOptions() []nats.Option {
	if o.natsUser == "" {
		return nil
	}
	return []nats.Option{nats.UserInfo(o.natsUser, o.natsPass)}
}

// waitWorker waits for a worker process and logs how it ended: an exit before
// the stack stops is unexpected but leaves the others running.
func waitWorker(stopping context.Context, log *slog.Logger, id string, cmd *exec.Cmd) {
	err := cmd.Wait()
	attrs := []any{"worker_id", id, "pid", cmd.Process.Pid}
	if ps := cmd.ProcessState; ps != nil {
		attrs = append(attrs, "exit_code", ps.ExitCode())
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			attrs = append(attrs, "signal", ws.Signal().String())
		}
	}
	switch {
	case stopping.Err() == nil:
		log.Error("worker exited unexpectedly; the others keep running", append(attrs, "err", err)...)
	case cmd.ProcessState != nil && cmd.ProcessState.Success():
		log.Info("worker stopped", attrs...)
	default:
		log.Warn("worker stopped with an error", append(attrs, "err", err)...)
	}
}

// waitLive waits until the frontend answers /live, or ctx ends, or 30s pass.
func waitLive(ctx context.Context, addr string) error {
	url := "http://" + localAddr(addr) + "/live"
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// listenText says where a listen address accepts connections.
func listenText(listen string) string {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return listen + " (all interfaces)"
	}
	return listen
}

// localAddr turns a listen address into one to connect to on this machine.
func localAddr(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

func printStack(env *environment, o *upOptions, natsURL string, pids []int) {
	base := "http://" + localAddr(o.cfg.HTTPAddr)
	w := env.stdout
	fmt.Fprintf(w, "baton up: the stack is running\n")
	auth := ""
	if o.natsUser != "" {
		auth = ", user " + o.natsUser
	}
	fmt.Fprintf(w, "  %-10s pid %-7d listening on %s (store %s%s)\n", "nats", os.Getpid(), strings.TrimPrefix(natsURL, "nats://"), filepath.Join(o.dataDir, "nats"), auth)
	fmt.Fprintf(w, "  %-10s pid %-7d listening on %s\n", "frontend", os.Getpid(), listenText(o.cfg.HTTPAddr))
	for i, pid := range pids {
		status := ""
		if p := o.workerSystemPort(i + 1); p != 0 {
			status = fmt.Sprintf(", status http://127.0.0.1:%d", p)
		}
		fmt.Fprintf(w, "  %-10s pid %-7d %s (model %s%s)\n", "worker", pid, upWorkerID(i+1), o.w.model, status)
	}
	fmt.Fprintf(w, "API:     %s/v1\n", base)
	fmt.Fprintf(w, "metrics: %s/metrics\n", base)
	fmt.Fprintf(w, "health:  %s/health\n", base)
	fmt.Fprintf(w, "NATS:    %s\n", natsURL)
	fmt.Fprintf(w, "try:     curl -N %s/v1/chat/completions -H 'Content-Type: application/json' -d '{\"model\":%q,\"messages\":[{\"role\":\"user\",\"content\":\"hello there\"}],\"stream\":true}'\n", base, o.w.model)
	fmt.Fprintf(w, "Ctrl-C stops everything.\n")
}
