// Package natsserver runs the embedded NATS server with JetStream that backs
// `baton nats` and `baton up`.
//
// The server has two accounts: BATON, where every component lives (clients
// that present no credentials land there, as user "baton", unless
// Config.User requires a login), with JetStream;
// and SYS, the system account, whose user "sys" sees the server's connect and
// disconnect advisories: baton's fast path for detecting a crashed worker.
//
// No secret has a default: the system account's password is given, or
// generated at first start and kept (mode 0600) in the store directory. With
// ClusterUser and ClusterPassword, routes must authenticate; with the
// cluster TLS files, they are encrypted and must present a certificate.
package natsserver

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/crypto/bcrypt"
)

// Defaults of Config.
const (
	DefaultPort    = 4222
	DefaultSysUser = "sys"
	AppUser        = "baton"
	AppAccount     = "BATON"
	SysAccount     = "SYS"
	// SysPasswordFile is the file, in the store directory, of the generated
	// system-account password.
	SysPasswordFile = "sys-password"
)

// Config describes an embedded server. Zero values mean the defaults.
type Config struct {
	Host        string   // listen address; default 127.0.0.1
	Port        int      // client port; default 4222, -1 for a random port
	StoreDir    string   // JetStream store; required unless InMemory
	InMemory    bool     // no store directory: streams must use memory storage
	ServerName  string   // unique in a cluster; default derived from the port
	ClusterName string   // joins a cluster when set
	ClusterPort int      // route port (with ClusterName)
	Routes      []string // nats-route://host:port of the other nodes
	HTTPPort    int      // monitoring port; 0 off
	SysUser     string   // system-account user; default "sys"
	SysPassword string   // its password; see ResolveSysPassword
	User        string   // BATON account user; when set, clients must log in (no anonymous access)
	Password    string   // its password (with User)

	// ClusterUser and ClusterPassword, when set, are required of every
	// route (and sent on the routes this node makes): a node without them
	// cannot join.
	ClusterUser, ClusterPassword string
	// ClusterTLSCert, ClusterTLSKey and ClusterTLSCA, when set, encrypt the
	// routes; each side must present a certificate signed by ClusterTLSCA.
	ClusterTLSCert, ClusterTLSKey, ClusterTLSCA string
	// ClusterInsecure lets the routes listen beyond loopback without route
	// authentication: any node that reaches the route port then joins and
	// receives every prompt. Validate refuses that unless this is set.
	ClusterInsecure bool
	// WorkerUsers are per-worker users of the BATON account, each holding
	// WorkerPermissions pinned to its own id (PinWorker). They need User:
	// an anonymous client would have every permission.
	WorkerUsers []WorkerUser
	// RequestPartitions, when above 1, grants WorkerUsers the request log's
	// partition streams too (ForPartitions): --request-partitions of the
	// components.
	RequestPartitions int
	// OutputOnly (--batched-output) takes from WorkerUsers the grant on
	// the request log's tokens subjects (OutputOnly): each writes only its
	// own output stream, for a fleet whose every frontend and worker runs
	// --batched-output.
	OutputOnly bool
}

// ResolveSysPassword sets the system-account password if c has none: the
// one stored in StoreDir/sys-password, or else a new random one, stored
// there with mode 0600 (kept in memory only for an InMemory server). It
// returns the file it came from or went to ("" for none).
func (c *Config) ResolveSysPassword() (string, error) {
	if c.SysPassword != "" {
		return "", nil
	}
	if c.StoreDir == "" {
		c.SysPassword = randomSecret()
		return "", nil
	}
	path := filepath.Join(c.StoreDir, SysPasswordFile)
	if data, err := os.ReadFile(path); err == nil {
		if pw := strings.TrimSpace(string(data)); pw != "" {
			c.SysPassword = pw
			return path, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("natsserver: read the system-account password: %w", err)
	}
	if err := os.MkdirAll(c.StoreDir, 0o700); err != nil {
		return "", fmt.Errorf("natsserver: store directory: %w", err)
	}
	pw := randomSecret()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, os.ErrExist) { // another process won the race
			data, rerr := os.ReadFile(path)
			if pw := strings.TrimSpace(string(data)); rerr == nil && pw != "" {
				c.SysPassword = pw
				return path, nil
			}
		}
		return "", fmt.Errorf("natsserver: store the system-account password: %w", err)
	}
	_, err = f.WriteString(pw + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("natsserver: store the system-account password: %w", err)
	}
	c.SysPassword = pw
	return path, nil
}

func randomSecret() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Validate reports every problem with c.
func (c Config) Validate() error {
	var errs []error
	if c.StoreDir == "" && !c.InMemory {
		errs = append(errs, errors.New("a store directory is required"))
	}
	if c.Port < -1 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("port %d out of range", c.Port))
	}
	if c.ClusterName != "" && (c.ClusterPort <= 0 || c.ClusterPort > 65535) {
		errs = append(errs, errors.New("a cluster needs --cluster-port"))
	}
	if (c.User == "") != (c.Password == "") {
		errs = append(errs, errors.New("--user and --password go together"))
	}
	if c.ClusterName == "" && len(c.Routes) > 0 {
		errs = append(errs, errors.New("--routes needs --cluster-name"))
	}
	if c.RequestPartitions != 0 {
		if err := streams.Partitions(c.RequestPartitions).Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(c.WorkerUsers) > 0 && c.User == "" {
		errs = append(errs, errors.New("--worker-users needs --user and --password: anonymous clients would have every permission"))
	}
	if c.OutputOnly && len(c.WorkerUsers) == 0 {
		errs = append(errs, errors.New("--batched-output confines worker users: it needs --worker-users"))
	}
	if (c.ClusterUser == "") != (c.ClusterPassword == "") {
		errs = append(errs, errors.New("--cluster-user and --cluster-password go together"))
	}
	if (c.ClusterTLSCert == "") != (c.ClusterTLSKey == "") || (c.ClusterTLSCert != "" && c.ClusterTLSCA == "") {
		errs = append(errs, errors.New("route TLS needs --cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca"))
	}
	if c.ClusterName == "" && (c.ClusterUser != "" || c.ClusterTLSCert != "") {
		errs = append(errs, errors.New("route authentication and TLS need --cluster-name"))
	}
	if c.ClusterName != "" && c.ClusterUser == "" && !c.ClusterInsecure && !Loopback(c.Host) {
		errs = append(errs, fmt.Errorf("routes listen on %s without route authentication: any node that reaches the route port "+
			"joins the cluster and receives every prompt; give --cluster-user and --cluster-password (and the route TLS files), "+
			"or --cluster-insecure to accept that", c.Host))
	}
	for _, r := range c.Routes {
		if u, err := url.Parse(r); err != nil || u.Host == "" {
			errs = append(errs, fmt.Errorf("route %q: want nats-route://host:port", r))
		}
	}
	return errors.Join(errs...)
}

// Loopback reports whether host, a listen address, is reachable from this
// machine only ("" is the default, 127.0.0.1).
func Loopback(host string) bool {
	if host == "" || host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (c Config) withDefaults() Config {
	if c.Host == "" {
		c.Host = "127.0.0.1"
	}
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.SysUser == "" {
		c.SysUser = DefaultSysUser
	}
	if c.ServerName == "" {
		c.ServerName = "baton-" + strconv.Itoa(c.Port)
		if c.Port == -1 {
			c.ServerName = "baton-embedded"
		}
	}
	return c
}

func (c Config) configString() string {
	q := strconv.Quote
	var b strings.Builder
	user, password := AppUser, AppUser
	if c.User != "" {
		user, password = c.User, c.Password
	}
	if c.User != "" {
		password = hashed(password)
	} // else the anonymous user's: no_auth_user compares it with itself, so it stays as it is
	fmt.Fprintf(&b, "accounts {\n  %s { jetstream: enabled, users: [\n    {user: %s, password: %s}\n", AppAccount, q(user), q(password))
	for _, w := range c.WorkerUsers {
		perms, _ := PinWorker(ForPartitions(WorkerPermissions, c.RequestPartitions), w.ID) // the constant has every pin
		if c.OutputOnly {
			perms, _ = OutputOnly(perms) // and the tokens grant
		}
		fmt.Fprintf(&b, "    {user: %s, password: %s, permissions: {\n%s\nallow_responses: true\n}}\n", q(w.ID), q(hashed(w.Password)), perms)
	}
	b.WriteString("  ] }\n")
	fmt.Fprintf(&b, "  %s { users: [{user: %s, password: %s}] }\n}\n", SysAccount, q(c.SysUser), q(hashed(c.SysPassword)))
	fmt.Fprintf(&b, "system_account: %s\n", SysAccount)
	if c.User == "" {
		// Clients without credentials land in BATON.
		fmt.Fprintf(&b, "no_auth_user: %s\n", AppUser)
	}
	if c.ClusterName != "" {
		fmt.Fprintf(&b, "cluster {\n  name: %s\n  listen: %s\n", q(c.ClusterName), q(net.JoinHostPort(c.Host, strconv.Itoa(c.ClusterPort))))
		if c.ClusterUser != "" {
			fmt.Fprintf(&b, "  authorization { user: %s, password: %s, timeout: 2 }\n", q(c.ClusterUser), q(c.ClusterPassword))
		}
		if c.ClusterTLSCert != "" {
			fmt.Fprintf(&b, "  tls { cert_file: %s, key_file: %s, ca_file: %s, verify: true, timeout: 2 }\n",
				q(c.ClusterTLSCert), q(c.ClusterTLSKey), q(c.ClusterTLSCA))
		}
		if len(c.Routes) > 0 {
			b.WriteString("  routes: [")
			for i, r := range c.Routes {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString(q(c.routeURL(r)))
			}
			b.WriteString("]\n")
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// routeURL is route r with the cluster credentials, unless it carries its own.
func (c Config) routeURL(r string) string {
	u, err := url.Parse(r)
	if err != nil || c.ClusterUser == "" || u.User != nil {
		return r
	}
	u.User = url.UserPassword(c.ClusterUser, c.ClusterPassword)
	return u.String()
}

// Start starts a server and waits until it accepts connections. Stop it with
// Shutdown and WaitForShutdown. Without a system-account password it calls
// ResolveSysPassword first; call it yourself to learn the password.
func Start(cfg Config, log *slog.Logger) (*server.Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := cfg.ResolveSysPassword(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	opts := &server.Options{}
	if err := opts.ProcessConfigString(cfg.configString()); err != nil {
		return nil, fmt.Errorf("natsserver: config: %w", err)
	}
	opts.Host = cfg.Host
	opts.Port = cfg.Port
	opts.ServerName = cfg.ServerName
	opts.JetStream = true
	opts.StoreDir = cfg.StoreDir
	if cfg.InMemory {
		opts.JetStreamMaxStore = 0
		opts.StoreDir = ""
	}
	opts.HTTPPort = cfg.HTTPPort
	opts.HTTPHost = cfg.Host
	opts.NoSigs = true
	opts.DisableJetStreamBanner = true
	if cfg.ClusterName != "" {
		// Give routes a moment in a fresh cluster; JetStream needs a quorum.
		opts.Cluster.ConnectRetries = 120
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsserver: %w", err)
	}
	if log != nil {
		// Without --user the one plaintext password is the anonymous user's,
		// which is no secret: nats-server's warning about it says nothing.
		s.SetLoggerV2(&slogAdapter{log: log, quietPlaintext: cfg.User == ""}, false, false, false)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return nil, errors.New("natsserver: not ready for connections after 30s")
	}
	return s, nil
}

// SysURL returns a client URL for the system-account user of a server at url.
func SysURL(clientURL, user, password string) string {
	if user == "" {
		user = DefaultSysUser
	}
	u, err := url.Parse(clientURL)
	if err != nil {
		return clientURL
	}
	u.User = url.UserPassword(user, password)
	return u.String()
}

// hashed is password as bcrypt, which nats-server compares a client's
// password with: the server's configuration then holds no password in
// plain text, and it stops warning "Plaintext passwords detected" at every
// start (issue 23). The configuration is never written to disk, and the
// generated passwords are random (192 bits), so the lowest cost serves: a
// login costs a millisecond, not the default cost's tens.
func hashed(password string) string {
	h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil { // a password over 72 bytes: kept as it is (nats-server compares plain text)
		return password
	}
	return string(h)
}

type slogAdapter struct {
	log            *slog.Logger
	quietPlaintext bool // drop "Plaintext passwords detected"
}

func (a *slogAdapter) Noticef(format string, v ...any) { a.log.Info(fmt.Sprintf(format, v...)) }
func (a *slogAdapter) Warnf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if a.quietPlaintext && strings.HasPrefix(msg, "Plaintext passwords detected") {
		a.log.Debug(msg)
		return
	}
	a.log.Warn(msg)
}
func (a *slogAdapter) Fatalf(format string, v ...any) { a.log.Error(fmt.Sprintf(format, v...)) }
func (a *slogAdapter) Errorf(format string, v ...any) { a.log.Error(fmt.Sprintf(format, v...)) }
func (a *slogAdapter) Debugf(format string, v ...any) { a.log.Debug(fmt.Sprintf(format, v...)) }
func (a *slogAdapter) Tracef(format string, v ...any) { a.log.Debug(fmt.Sprintf(format, v...)) }
