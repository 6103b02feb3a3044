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
)

// securityFlags are the frontend's API keys, connection bounds, tenant
// limits and TLS (docs/security.md).
type securityFlags struct {
	apiKeysFile         string
	maxChildren         int
	readHeaderTimeout   time.Duration
	bodyTimeout         time.Duration
	idleTimeout         time.Duration
	maxConnections      int
	maxPerAddress       int
	tenantMaxConcurrent int
	writeTimeout        time.Duration
	tenantRPS           float64
	tlsCert, tlsKey     string
}

func (s *securityFlags) add(f *flagSet) {
	f.StringVar(&s.apiKeysFile, "api-keys-file", "", "`file` of API keys, lines of 'TENANT SECRET' ('#' comments); every endpoint but /live, /health, /metrics and the console's page then needs 'Authorization: Bearer SECRET' (the console's data: the tenant admin's); SIGHUP reloads it")
	f.bindEnv("api-keys-file", "BATON_API_KEYS_FILE", nil)
	f.showDefault("api-keys-file", "none: the API is open")
	f.IntVar(&s.maxChildren, "max-children", frontend.DefaultMaxChildren, "most children of one request (X-Parent-Request-Id); 400 beyond")
	f.bindEnv("max-children", "BATON_MAX_CHILDREN", nil)
	f.DurationVar(&s.readHeaderTimeout, "read-header-timeout", frontend.DefaultReadHeaderTimeout, "how long a client may take to send a request's headers, a `duration`")
	f.bindEnv("read-header-timeout", "BATON_READ_HEADER_TIMEOUT", nil)
	f.DurationVar(&s.bodyTimeout, "body-timeout", frontend.DefaultBodyTimeout, "how long a client may take to send a request's body (408 beyond), a `duration`")
	f.bindEnv("body-timeout", "BATON_BODY_TIMEOUT", nil)
	f.DurationVar(&s.idleTimeout, "idle-timeout", frontend.DefaultIdleTimeout, "close a keep-alive connection idle this long, a `duration`")
	f.bindEnv("idle-timeout", "BATON_IDLE_TIMEOUT", nil)
	f.IntVar(&s.maxConnections, "max-connections", frontend.DefaultMaxConnections, fmt.Sprintf("most open HTTP connections: beyond, 503 (with %d more kept for /live and /health)", frontend.ProbeHeadroom))
	f.bindEnv("max-connections", "BATON_MAX_CONNECTIONS", nil)
	f.IntVar(&s.maxPerAddress, "max-connections-per-address", frontend.DefaultMaxConnectionsPerAddress,
		fmt.Sprintf("most open HTTP connections per remote IPv4 address or IPv6 /64: beyond, 503 (0 off: behind a proxy or load balancer every connection comes from its address, so the cap belongs there); a new connection must send its first byte within %v", frontend.FirstByteTimeout))
	f.bindEnv("max-connections-per-address", "BATON_MAX_CONNECTIONS_PER_ADDRESS", nil)
	f.IntVar(&s.tenantMaxConcurrent, "tenant-max-concurrent", -1, "most open completions and resumes per tenant (429 beyond; a background response counts until it ends); 0 unlimited")
	f.bindEnv("tenant-max-concurrent", "BATON_TENANT_MAX_CONCURRENT", nil)
	f.showDefault("tenant-max-concurrent", "with --api-keys-file a quarter of --max-connections, else unlimited")
	f.DurationVar(&s.writeTimeout, "write-timeout", frontend.DefaultWriteTimeout, "disconnect a client that stops reading a stream this long after a write could not go out, a `duration`")
	f.bindEnv("write-timeout", "BATON_WRITE_TIMEOUT", nil)
	f.Float64Var(&s.tenantRPS, "tenant-rps", 0, "most API requests per second per tenant, burst max(1, rps) (429 with Retry-After beyond); 0 unlimited")
	f.bindEnv("tenant-rps", "BATON_TENANT_RPS", nil)
	f.showDefault("tenant-rps", "unlimited")
	f.StringVar(&s.tlsCert, "tls-cert", "", "PEM certificate `file`: serve the API over TLS (with --tls-key)")
	f.bindEnv("tls-cert", "BATON_TLS_CERT", nil)
	f.showDefault("tls-cert", "off")
	f.StringVar(&s.tlsKey, "tls-key", "", "PEM private key `file` of --tls-cert")
	f.bindEnv("tls-key", "BATON_TLS_KEY", nil)
	f.showDefault("tls-key", "off")
}

// apply checks the flags and sets them on cfg.
func (s *securityFlags) apply(cfg *frontend.Config) error {
	var errs []error
	for name, d := range map[string]time.Duration{"--read-header-timeout": s.readHeaderTimeout, "--body-timeout": s.bodyTimeout, "--idle-timeout": s.idleTimeout} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s %v: must be positive", name, d))
		}
	}
	if s.maxChildren <= 0 {
		errs = append(errs, fmt.Errorf("--max-children %d: must be positive", s.maxChildren))
	}
	if s.maxConnections <= 0 {
		errs = append(errs, fmt.Errorf("--max-connections %d: must be positive", s.maxConnections))
	}
	if s.maxPerAddress < 0 {
		errs = append(errs, fmt.Errorf("--max-connections-per-address %d: must not be negative (0 is off)", s.maxPerAddress))
	}
	if s.writeTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--write-timeout %v: must be positive", s.writeTimeout))
	}
	if s.tenantMaxConcurrent < -1 || s.tenantRPS < 0 {
		errs = append(errs, errors.New("--tenant-max-concurrent and --tenant-rps must not be negative"))
	}
	if (s.tlsCert == "") != (s.tlsKey == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key go together"))
	}
	for _, file := range []string{s.tlsCert, s.tlsKey} {
		if file != "" {
			if _, err := os.Stat(file); err != nil {
				errs = append(errs, fmt.Errorf("TLS: %w", err))
			}
		}
	}
	if s.apiKeysFile != "" {
		if err := frontend.CheckAPIKeysFile(s.apiKeysFile); err != nil {
			errs = append(errs, err)
		}
	}
	cfg.APIKeysFile, cfg.MaxChildren = s.apiKeysFile, s.maxChildren
	cfg.ReadHeaderTimeout, cfg.BodyTimeout, cfg.IdleTimeout = s.readHeaderTimeout, s.bodyTimeout, s.idleTimeout
	cfg.MaxConnections, cfg.TenantRPS, cfg.WriteTimeout = s.maxConnections, s.tenantRPS, s.writeTimeout
	cfg.MaxConnectionsPerAddress = s.maxPerAddress // Config's 0 is the default, negative none
	if s.maxPerAddress == 0 {
		cfg.MaxConnectionsPerAddress = -1
	}
	switch s.tenantMaxConcurrent { // Config's 0 is the default, negative none
	case -1:
		cfg.TenantMaxConcurrent = 0
	case 0:
		cfg.TenantMaxConcurrent = -1
	default:
		cfg.TenantMaxConcurrent = s.tenantMaxConcurrent
	}
	cfg.TLSCertFile, cfg.TLSKeyFile = s.tlsCert, s.tlsKey
	return errors.Join(errs...)
}

// reloadKeysOnHangup reloads the frontend's API keys on every SIGHUP until
// ctx ends; a file that does not parse leaves the keys in use.
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
			}
		}
	}()
}
