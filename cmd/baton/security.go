package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/baton-dev/baton/services/frontend"
	"github.com/baton-dev/baton/services/frontend/httpguard"
	"github.com/baton-dev/baton/services/frontend/runner"
)

// securityFlags are the frontend's API keys, connection bounds, tenant
// limits and TLS (docs/security.md).
// Most bind straight into the frontend's Config (add's cfg); the two that
// mean another thing by 0 than Config does are translated by apply.
type securityFlags struct {
	maxPerAddress       int // 0 is off, where Config's 0 is the default
	tenantMaxConcurrent int
}

func (s *securityFlags) add(f *flagSet, cfg *frontend.Config) {
	f.StringVar(&cfg.APIKeysFile, "api-keys-file", "", "`file` of API keys, lines of 'TENANT SECRET' ('#' comments); every endpoint but /live, /health, /metrics and the console's page then needs 'Authorization: Bearer SECRET' (the console's data: the tenant admin's); SIGHUP reloads it")
	f.bindEnv("api-keys-file", "BATON_API_KEYS_FILE", nil)
	f.showDefault("api-keys-file", "none: the API is open")
	f.IntVar(&cfg.Runtime.MaxChildren, "max-children", runner.DefaultMaxChildren, "most children of one request (X-Parent-Request-Id); 400 beyond")
	f.bindEnv("max-children", "BATON_MAX_CHILDREN", nil)
	f.DurationVar(&cfg.ReadHeaderTimeout, "read-header-timeout", frontend.DefaultReadHeaderTimeout, "how long a client may take to send a request's headers, a `duration`")
	f.bindEnv("read-header-timeout", "BATON_READ_HEADER_TIMEOUT", nil)
	f.DurationVar(&cfg.BodyTimeout, "body-timeout", frontend.DefaultBodyTimeout, "how long a client may take to send a request's body (408 beyond), a `duration`")
	f.bindEnv("body-timeout", "BATON_BODY_TIMEOUT", nil)
	f.DurationVar(&cfg.IdleTimeout, "idle-timeout", frontend.DefaultIdleTimeout, "close a keep-alive connection idle this long, a `duration`")
	f.bindEnv("idle-timeout", "BATON_IDLE_TIMEOUT", nil)
	f.IntVar(&cfg.MaxConnections, "max-connections", frontend.DefaultMaxConnections, fmt.Sprintf("most open HTTP connections: beyond, 503 (with %d more kept for /live and /health)", httpguard.ProbeHeadroom))
	f.bindEnv("max-connections", "BATON_MAX_CONNECTIONS", nil)
	f.IntVar(&s.maxPerAddress, "max-connections-per-address", frontend.DefaultMaxConnectionsPerAddress,
		fmt.Sprintf("most open HTTP connections per remote IPv4 address or IPv6 /64: beyond, 503 (0 off: behind a proxy or load balancer every connection comes from its address, so the cap belongs there); a new connection must send its first byte within %v", httpguard.FirstByteTimeout))
	f.bindEnv("max-connections-per-address", "BATON_MAX_CONNECTIONS_PER_ADDRESS", nil)
	f.IntVar(&s.tenantMaxConcurrent, "tenant-max-concurrent", -1, "most open completions and resumes per tenant on this frontend (429 beyond; a background response counts until it ends), for tenants without concurrent=N in --tenant-budgets-file; 0 unlimited")
	f.bindEnv("tenant-max-concurrent", "BATON_TENANT_MAX_CONCURRENT", nil)
	f.showDefault("tenant-max-concurrent", "with --api-keys-file a quarter of --max-connections, else unlimited")
	f.DurationVar(&cfg.WriteTimeout, "write-timeout", frontend.DefaultWriteTimeout, "disconnect a client that stops reading a stream this long after a write could not go out, a `duration`")
	f.bindEnv("write-timeout", "BATON_WRITE_TIMEOUT", nil)
	f.Float64Var(&cfg.Tenants.RPS, "tenant-rps", 0, "most API requests per second per tenant, burst max(1, rps) (429 with Retry-After beyond); 0 unlimited")
	f.bindEnv("tenant-rps", "BATON_TENANT_RPS", nil)
	f.showDefault("tenant-rps", "unlimited")
	f.StringVar(&cfg.Tenants.BudgetsFile, "tenant-budgets-file", "", "`file` of per-tenant budgets, lines of 'TENANT [rpm=N] [tpm=N] [concurrent=N] [log=F] [weight=W]' ('#' comments): rpm and tpm are one budget across every frontend (the same file on each), in every 60 s window; concurrent is one cap across every frontend, in place of --tenant-max-concurrent; log is the tenant's share of the request log (503 log_full past it); SIGHUP reloads it")
	f.bindEnv("tenant-budgets-file", "BATON_TENANT_BUDGETS_FILE", nil)
	f.showDefault("tenant-budgets-file", "none")
	f.Int64Var(&cfg.Tenants.RPM, "tenant-rpm", 0, "completions and responses created per minute per tenant without an rpm in --tenant-budgets-file, one budget across every frontend (429 rate_limit_exceeded beyond); 0 unlimited")
	f.bindEnv("tenant-rpm", "BATON_TENANT_RPM", nil)
	f.showDefault("tenant-rpm", "unlimited")
	f.Int64Var(&cfg.Tenants.TPM, "tenant-tpm", 0, "tokens (prompt + max tokens reserved, the unused given back) per minute per tenant without a tpm in --tenant-budgets-file, one budget across every frontend; 0 unlimited")
	f.bindEnv("tenant-tpm", "BATON_TENANT_TPM", nil)
	f.showDefault("tenant-tpm", "unlimited")
	f.StringVar(&cfg.TLSCertFile, "tls-cert", "", "PEM certificate `file`: serve the API over TLS (with --tls-key)")
	f.bindEnv("tls-cert", "BATON_TLS_CERT", nil)
	f.showDefault("tls-cert", "off")
	f.StringVar(&cfg.TLSKeyFile, "tls-key", "", "PEM private key `file` of --tls-cert")
	f.bindEnv("tls-key", "BATON_TLS_KEY", nil)
	f.showDefault("tls-key", "off")
}

// apply checks the flags and sets on cfg (a copy of the Config they bound
// into) the one they do not bind straight.
func (s *securityFlags) apply(cfg *frontend.Config) error {
	var errs []error
	for name, d := range map[string]time.Duration{"--read-header-timeout": cfg.ReadHeaderTimeout, "--body-timeout": cfg.BodyTimeout, "--idle-timeout": cfg.IdleTimeout} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s %v: must be positive", name, d))
		}
	}
	if cfg.Runtime.MaxChildren <= 0 {
		errs = append(errs, fmt.Errorf("--max-children %d: must be positive", cfg.Runtime.MaxChildren))
	}
	if cfg.MaxConnections <= 0 {
		errs = append(errs, fmt.Errorf("--max-connections %d: must be positive", cfg.MaxConnections))
	}
	if s.maxPerAddress < 0 {
		errs = append(errs, fmt.Errorf("--max-connections-per-address %d: must not be negative (0 is off)", s.maxPerAddress))
	}
	if cfg.WriteTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--write-timeout %v: must be positive", cfg.WriteTimeout))
	}
	if s.tenantMaxConcurrent < -1 || cfg.Tenants.RPS < 0 || cfg.Tenants.RPM < 0 || cfg.Tenants.TPM < 0 {
		errs = append(errs, errors.New("--tenant-max-concurrent, --tenant-rps, --tenant-rpm and --tenant-tpm must not be negative"))
	}
	if cfg.Tenants.BudgetsFile != "" {
		if err := frontend.CheckTenantBudgetsFile(cfg.Tenants.BudgetsFile); err != nil {
			errs = append(errs, err)
		}
	}
	if (cfg.TLSCertFile == "") != (cfg.TLSKeyFile == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key go together"))
	}
	for _, file := range []string{cfg.TLSCertFile, cfg.TLSKeyFile} {
		if file != "" {
			if _, err := os.Stat(file); err != nil {
				errs = append(errs, fmt.Errorf("TLS: %w", err))
			}
		}
	}
	if cfg.APIKeysFile != "" {
		if err := frontend.CheckAPIKeysFile(cfg.APIKeysFile); err != nil {
			errs = append(errs, err)
		}
	}
	cfg.MaxConnectionsPerAddress = s.maxPerAddress // Config's 0 is the default, negative none
	if s.maxPerAddress == 0 {
		cfg.MaxConnectionsPerAddress = -1
	}
	switch s.tenantMaxConcurrent { // Config's 0 is the default, negative none
	case -1:
		cfg.Tenants.MaxConcurrent = 0
	case 0:
		cfg.Tenants.MaxConcurrent = -1
	default:
		cfg.Tenants.MaxConcurrent = s.tenantMaxConcurrent
	}
	return errors.Join(errs...)
}

// reloadKeysOnHangup reloads the frontend's API keys and tenant budgets on
// every SIGHUP until ctx ends; a file that does not parse leaves what it
// held in use.
func reloadKeysOnHangup(ctx context.Context, fe *frontend.Frontend, log *slog.Logger) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGHUP)
	go func() {
		defer signal.Stop(c)
		for {
			select {
			case <-ctx.Done():
				return
			case <-c:
				if err := fe.ReloadKeys(); err != nil {
					log.Error("reload API keys on SIGHUP: the keys in use stay", "err", err)
				}
				if err := fe.ReloadBudgets(); err != nil {
					log.Error("reload tenant budgets on SIGHUP: the budgets in use stay", "err", err)
				}
			}
		}
	}()
}
