// Command vllmsim serves a simulated vLLM OpenAI-compatible API (package
// internal/vllmsim) for tests, the chaos soak and a try-out stack:
//
//	vllmsim --port 8100 --model sim --token-delay 20ms
//
// It prints "vllmsim listening on http://ADDR" once it accepts connections
// and shuts down gracefully on SIGINT or SIGTERM. Bad flags exit 2.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/baton-dev/baton/internal/pprofmux"
	"github.com/baton-dev/baton/internal/vllmsim"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("vllmsim", flag.ContinueOnError)
	host := fs.String("host", "127.0.0.1", "address to listen on")
	port := fs.Int("port", 8100, "port to listen on (0: any free port)")
	var cfg vllmsim.Config
	fs.StringVar(&cfg.Model, "model", "sim", "served model name")
	fs.IntVar(&cfg.MaxModelLen, "max-model-len", 4096, "maximum prompt + completion tokens")
	fs.DurationVar(&cfg.TTFT, "ttft", 0, "delay before the first token")
	fs.DurationVar(&cfg.TokenDelay, "token-delay", 0, "delay before each later token")
	fs.StringVar(&cfg.APIKey, "api-key", "", "require this bearer token on /v1 (401 otherwise)")
	fs.BoolVar(&cfg.ChatOnly, "chat-only", false, "serve /v1/chat/completions only (/v1/completions answers 404)")
	fs.BoolVar(&cfg.RejectPrefill, "reject-prefill", false, "answer 400 to continue_final_message")
	fs.BoolVar(&cfg.Greedy, "greedy", false, "temperature 0 unless a request sets one (vLLM's default is 1)")
	fs.BoolVar(&cfg.NoTokenIDs, "no-token-ids", false, "ignore return_token_ids and reject token-id prompts (400)")
	fs.StringVar(&cfg.ListedModel, "listed-model", "", "the name GET /v1/models lists instead of --model (requests may name either)")
	fs.IntVar(&cfg.Slots, "slots", 0, "generations that run at once; the rest queue, sending nothing until a slot frees (0: no limit)")
	fs.BoolVar(&cfg.TemplatedCompletions, "templated-completions", false, "wrap a /v1/completions prompt in the chat template as a user message, as Ollama does")
	fs.BoolVar(&cfg.IgnorePrefill, "ignore-prefill", false, "accept continue_final_message but open a new assistant turn, as a template without prefill does")
	fs.IntVar(&cfg.RetokenizePrefill, "retokenize-prefill", 0, "re-tokenize a prefilled assistant message of at least this many `tokens` into other ids than generated, as Ollama does (0: off)")
	fault := fs.String("fault", "", "fault for every request, or the first --fault-requests: STATUS[:RETRY_AFTER_S][@N] or cut|malformed|nodone|stall[@N] or policy|context (N: tokens sent before it)")
	fs.IntVar(&cfg.FaultRequests, "fault-requests", 0, "apply --fault to the first N generation requests only (0: all)")
	fs.StringVar(&cfg.FaultMatch, "fault-match", "", "apply --fault only to requests whose body contains this text (--fault-requests counts only those)")
	pprofAddr := fs.String("pprof-addr", "", "serve Go profiles (/debug/pprof/) on this address, for measurements (off unless set)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	f, err := vllmsim.ParseFault(*fault)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vllmsim:", err)
		return 2
	}
	cfg.Fault = f
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "vllmsim: unexpected arguments %v\n", fs.Args())
		return 2
	}
	l, err := net.Listen("tcp", net.JoinHostPort(*host, strconv.Itoa(*port)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "vllmsim:", err)
		return 1
	}
	if *pprofAddr != "" {
		pl, err := net.Listen("tcp", *pprofAddr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "vllmsim: --pprof-addr:", err)
			return 2
		}
		go func() { _ = http.Serve(pl, pprofmux.New()) }()
	}
	srv := &http.Server{Handler: vllmsim.New(cfg), ReadHeaderTimeout: 10 * time.Second}
	fmt.Printf("vllmsim listening on http://%s model=%s\n", l.Addr(), cfg.Model)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		fmt.Fprintln(os.Stderr, "vllmsim:", err)
		return 1
	case <-ctx.Done():
	}
	stop() // a second signal exits at once
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return 0
}
