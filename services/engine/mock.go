package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Defaults of MockConfig.
const (
	DefaultMockTokensPerSec = 100
	DefaultMockTTFT         = 50 * time.Millisecond
	DefaultMockKVBlocks     = 16384
	DefaultMockBlockSize    = 64
)

// MockConfig sets the mock engine's simulated timing, KV cache and scripted
// faults. Zero values mean the documented defaults.
type MockConfig struct {
	TokensPerSec float64       // decode rate per request; default 100
	TTFT         time.Duration // time to first token; default 50ms
	KVBlocks     int           // KV-cache blocks; default 16384
	BlockSize    int           // tokens per KV block; default 64
	// SpeedupRatio divides every delay; default 1. A very large value (or
	// +Inf) runs at full speed, with no timers at all.
	SpeedupRatio float64
	// CrashAfterTokens > 0 kills the process with SIGKILL right after it has
	// emitted that many tokens in total, across requests. This and the other
	// scripted faults count clients' requests only: a worker's canaries
	// (WithCanary) are served but not counted.
	CrashAfterTokens int
	// StallAfterTokens > 0 stops emitting after that many tokens in total:
	// Generate blocks until its ctx is done, the process stays alive.
	StallAfterTokens int
	// EngineErrorAfter > 0 serves that many requests; every later Generate
	// fails at once with an error wrapping ErrFatal.
	EngineErrorAfter int
	// HoldAtToken > 0 pauses every generation before the token at that
	// offset of its output until Release is called, so that a test can hold
	// requests in flight at a known point for as long as its setup takes.
	// A generation that starts past the offset is not held.
	HoldAtToken int
	// EmitTime (benchmarks only) makes each token's text the time the
	// engine emitted it, "@<Unix ns> " (EmitTimes reads it back), in place
	// of MockToken: a client then measures emit-to-read latency exactly,
	// with nothing on baton's path but the text. The output is no longer
	// deterministic.
	EmitTime bool
}

func (c MockConfig) withDefaults() MockConfig {
	c.TokensPerSec = cmp.Or(c.TokensPerSec, DefaultMockTokensPerSec)
	c.TTFT = cmp.Or(c.TTFT, DefaultMockTTFT)
	c.KVBlocks = cmp.Or(c.KVBlocks, DefaultMockKVBlocks)
	c.BlockSize = cmp.Or(c.BlockSize, DefaultMockBlockSize)
	c.SpeedupRatio = cmp.Or(c.SpeedupRatio, 1)
	return c
}

// Validate reports every problem with c. Zero values are valid (defaults).
func (c MockConfig) Validate() error {
	var errs []error
	if c.TokensPerSec < 0 || math.IsNaN(c.TokensPerSec) || math.IsInf(c.TokensPerSec, 0) {
		errs = append(errs, fmt.Errorf("mock tokens per second %v: want a positive number", c.TokensPerSec))
	}
	if c.TTFT < 0 {
		errs = append(errs, fmt.Errorf("mock ttft %v: must not be negative", c.TTFT))
	}
	if c.KVBlocks < 0 {
		errs = append(errs, fmt.Errorf("mock kv blocks %d: must not be negative", c.KVBlocks))
	}
	if c.BlockSize < 0 {
		errs = append(errs, fmt.Errorf("mock block size %d: must not be negative", c.BlockSize))
	}
	if c.SpeedupRatio < 0 || math.IsNaN(c.SpeedupRatio) {
		errs = append(errs, fmt.Errorf("mock speedup ratio %v: want a positive number", c.SpeedupRatio))
	}
	if c.CrashAfterTokens < 0 || c.StallAfterTokens < 0 || c.EngineErrorAfter < 0 || c.HoldAtToken < 0 {
		errs = append(errs, errors.New("mock fault thresholds must not be negative"))
	}
	return errors.Join(errs...)
}

// Mock is a deterministic engine: token i of a request is MockToken(prompt, i).
// It simulates time to first token, decode rate and KV-cache occupancy, and
// can crash, stall or fail on script. It is safe for concurrent use.
type Mock struct {
	cfg  MockConfig
	ttft time.Duration // TTFT / speedup
	itl  time.Duration // inter-token latency / speedup

	emitted atomic.Int64 // tokens emitted, all requests
	started atomic.Int64 // Generate calls
	aborts  aborts

	released    chan struct{} // closed by Release: HoldAtToken holds no more
	releaseOnce sync.Once

	mu     sync.Mutex
	active map[*mockRequest]struct{}
	// The sums Stats reports over active, kept as tokens come rather than
	// summed at every call: a worker reads Stats after every delta it
	// flushes, with hundreds of generations active.
	kvUsed atomic.Int64 // sum of ceil((prefill + generated) / BlockSize)
	queued atomic.Int64 // sum of prefill over those with no token yet
}

// mockRequest is the KV state of one running generation. Only its
// Generate call writes it.
type mockRequest struct {
	prefill   int // tokens in the KV cache before decoding (prompt + continued text)
	generated int // tokens emitted so far
}

// NewMock returns a mock engine; cfg's zero values mean the defaults.
func NewMock(cfg MockConfig) (*Mock, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("engine: mock config: %w", err)
	}
	cfg = cfg.withDefaults()
	return &Mock{
		cfg:    cfg,
		ttft:   scale(cfg.TTFT, cfg.SpeedupRatio),
		itl:    scale(time.Duration(float64(time.Second)/cfg.TokensPerSec), cfg.SpeedupRatio),
		active: map[*mockRequest]struct{}{},

		released: make(chan struct{}),
	}, nil
}

// Release lets every generation held at HoldAtToken go on, and every later
// one pass the offset without pausing. It is safe to call more than once.
func (m *Mock) Release() { m.releaseOnce.Do(func() { close(m.released) }) }

func scale(d time.Duration, speedup float64) time.Duration {
	v := float64(d) / speedup
	if v < 1 { // includes +Inf speedup
		return 0
	}
	return time.Duration(v)
}

// Generate emits the tokens at offsets [StartOffset, MaxTokens) of req's
// output, waiting TTFT before the first and the inter-token latency between
// tokens. It finishes with FinishLength, ctx's error when cancelled, or an
// error wrapping ErrFatal when the script says so. A generation cancelled
// at any point, its time to first token included, lets go of the engine at
// once and counts as aborted in Stats.
func (m *Mock) Generate(ctx context.Context, req Request, emit func(Token) error) (res Result, err error) {
	defer func() { m.aborts.record(ctx, err) }()
	if req.StartOffset < 0 || req.MaxTokens < req.StartOffset {
		return Result{}, fmt.Errorf("engine: mock: bad token range [%d, %d)", req.StartOffset, req.MaxTokens)
	}
	canary := IsCanary(ctx) // not counted by the scripted faults
	n := m.started.Load()
	if !canary {
		n = m.started.Add(1)
	}
	if lim := m.cfg.EngineErrorAfter; lim > 0 && n > int64(lim) {
		return Result{}, fmt.Errorf("%w: mock scripted failure after %d requests", ErrFatal, lim)
	}
	prompt := req.PromptTokens
	if prompt <= 0 {
		prompt = CountTokens(req.Prompt)
	}
	r := &mockRequest{prefill: prompt + req.StartOffset}
	defer m.occupy(r)()
	w := &waiter{ctx: ctx}
	defer w.stop()

	h := promptHash(req.Prompt)
	for i := req.StartOffset; i < req.MaxTokens; i++ {
		d := m.itl
		if i == req.StartOffset {
			d = m.ttft
		}
		if err := w.wait(d); err != nil {
			return Result{}, err
		}
		if err := m.hold(ctx, i); err != nil {
			return Result{}, err
		}
		total := m.emitted.Load()
		if !canary {
			total = m.emitted.Add(1)
		}
		if lim := m.cfg.StallAfterTokens; lim > 0 && total > int64(lim) {
			<-ctx.Done() // stalled: alive, leased, silent
			return Result{}, ctx.Err()
		}
		if err := emit(Token{Text: m.text(h, i)}); err != nil {
			return Result{}, err
		}
		m.generated(r)
		if lim := m.cfg.CrashAfterTokens; lim > 0 && total == int64(lim) && !canary {
			if err := syscall.Kill(os.Getpid(), syscall.SIGKILL); err != nil {
				return Result{}, fmt.Errorf("%w: mock crash: %w", ErrFatal, err)
			}
			select {} // SIGKILL cannot be caught: the process is going
		}
	}
	return Result{FinishReason: FinishLength}, nil
}

// occupy counts r in the engine's KV cache and queue, as its prefill
// takes them, until the returned function is called.
func (m *Mock) occupy(r *mockRequest) (leave func()) {
	bs := m.cfg.BlockSize
	m.mu.Lock()
	m.active[r] = struct{}{}
	m.kvUsed.Add(int64((r.prefill + bs - 1) / bs))
	m.queued.Add(int64(r.prefill))
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		delete(m.active, r)
		m.kvUsed.Add(-int64((r.prefill + r.generated + bs - 1) / bs))
		if r.generated == 0 {
			m.queued.Add(-int64(r.prefill))
		}
		m.mu.Unlock()
	}
}

// generated counts one more token of r: its prefill leaves the queue at the
// first, and the cache grows by a block when it ended on a block's boundary.
func (m *Mock) generated(r *mockRequest) {
	// ceil((x+1)/bs) - ceil(x/bs) is 1 iff bs divides x.
	if (r.prefill+r.generated)%m.cfg.BlockSize == 0 {
		m.kvUsed.Add(1)
	}
	if r.generated == 0 {
		m.queued.Add(-int64(r.prefill))
	}
	r.generated++
}

// waiter waits on one timer, reused, until its ctx is done.
type waiter struct {
	ctx   context.Context
	timer *time.Timer
}

// wait waits d, or returns ctx's error when it is done first (at once when
// d is not positive).
func (w *waiter) wait(d time.Duration) error {
	if d <= 0 {
		return w.ctx.Err()
	}
	if w.timer == nil {
		w.timer = time.NewTimer(d)
	} else {
		w.timer.Reset(d)
	}
	select {
	case <-w.ctx.Done():
		return w.ctx.Err()
	case <-w.timer.C:
		return nil
	}
}

func (w *waiter) stop() {
	if w.timer != nil {
		w.timer.Stop()
	}
}

// hold waits before the token at offset i until Release when the script
// holds generations there (MockConfig.HoldAtToken), or ctx is done.
func (m *Mock) hold(ctx context.Context, i int) error {
	if at := m.cfg.HoldAtToken; at <= 0 || i != at {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-m.released:
		return nil
	}
}

// text is token i's text of the prompt whose hash is h: MockToken's, or
// with MockConfig.EmitTime the time it is emitted.
func (m *Mock) text(h uint64, i int) string {
	if m.cfg.EmitTime {
		return "@" + strconv.FormatInt(time.Now().UnixNano(), 10) + " "
	}
	return tokenAt(h, i)
}

// Stats reports the simulated load: each active request holds
// ceil((prefill + generated) / BlockSize) KV blocks; a request that has not
// emitted its first token counts its prefill as queued.
func (m *Mock) Stats() Stats {
	s := Stats{KVBlocksTotal: m.cfg.KVBlocks}
	s.Aborted, s.LastAbort = m.aborts.read()
	m.mu.Lock()
	defer m.mu.Unlock()
	s.ActiveRequests = len(m.active)
	s.KVBlocksUsed = min(int(m.kvUsed.Load()), s.KVBlocksTotal)
	s.QueuedPrefillTokens = int(m.queued.Load())
	return s
}

// EmitTimes appends to ns the emit times that text holds, the tokens of a
// mock engine run with MockConfig.EmitTime ("@<Unix ns> " each), and
// returns it; other text adds nothing.
func EmitTimes(ns []int64, text string) []int64 {
	for {
		_, rest, ok := strings.Cut(text, "@")
		if !ok {
			return ns
		}
		end := 0
		for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
			end++
		}
		if v, err := strconv.ParseInt(rest[:end], 10, 64); err == nil {
			ns = append(ns, v)
		}
		text = rest[end:]
	}
}

// CountTokens is the mock's tokenizer: the number of whitespace-separated words.
func CountTokens(s string) int { return len(strings.Fields(s)) }

// FNV-1a 64 parameters.
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

func promptHash(prompt string) uint64 {
	h := uint64(fnvOffset64)
	for i := 0; i < len(prompt); i++ {
		h ^= uint64(prompt[i])
		h *= fnvPrime64
	}
	return h
}

// tokenAt continues the prompt's FNV-1a hash with i as 8 little-endian bytes.
func tokenAt(promptHash uint64, i int) string {
	h := promptHash
	v := uint64(i)
	for range 8 {
		h ^= v & 0xff
		h *= fnvPrime64
		v >>= 8
	}
	return mockTokens[h%uint64(len(mockTokens))]
}

// mockTokens are mockWords, each followed by a space: the token texts, built
// once rather than at every token.
var mockTokens = func() (t [len(mockWords)]string) {
	for i, w := range mockWords {
		t[i] = w + " "
	}
	return t
}()

// MockToken is token i of the mock's output for prompt: a word chosen by the
// FNV-1a 64 hash of (prompt, i), followed by a space. It depends on nothing
// else, so every mock worker produces the same output for the same prompt.
func MockToken(prompt string, i int) string { return tokenAt(promptHash(prompt), i) }

// MockText is the mock's output for prompt at token offsets [from, to): what
// a fault-free run produces there.
func MockText(prompt string, from, to int) string {
	h := promptHash(prompt)
	var b strings.Builder
	for i := from; i < to; i++ {
		b.WriteString(tokenAt(h, i))
	}
	return b.String()
}
