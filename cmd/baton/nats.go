package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/baton-dev/baton/services/natsserver"
)

const natsSummary = `Runs a standalone NATS server with JetStream from the embedded library, so
scripts and compose files need no separate install. Accounts: BATON (every
client without credentials, with JetStream) and SYS (the system account, whose
user sees the connect/disconnect advisories baton uses to detect crashed
workers; its password is --sys-password, or generated at first start and kept
in <store-dir>/sys-password, mode 0600). With --user/--password, BATON admits
only that user, and --worker-users adds one user per worker, confined to its
own lease, load and dispatch subjects (and, with --batched-output, to its own
output stream: no write on the request log). For a 3-node cluster give each node
--server-name, --cluster-name, --cluster-port and --routes naming the other
nodes; with --cluster-user/--cluster-password (and the route TLS files) a node
without them cannot join. Runs until SIGINT/SIGTERM.`

// natsOptions are the flags of `baton nats`.
type natsOptions struct {
	common      *commonFlags
	cfg         natsserver.Config
	routes      string
	workerUsers string
	pprof       *string
}

func parseNATS(env *environment, args []string) (*natsOptions, error) {
	f := newFlagSet("nats", natsSummary, env.lookup, env.stdout)
	o := &natsOptions{common: addCommonFlags(f), pprof: addPprofFlag(f)}
	f.IntVar(&o.cfg.Port, "port", natsserver.DefaultPort, "client `port`; -1 picks a free one")
	f.StringVar(&o.cfg.Host, "host", "127.0.0.1", "listen `address` (0.0.0.0 for all interfaces)")
	f.StringVar(&o.cfg.StoreDir, "store-dir", "./.baton/nats", "JetStream store `directory`")
	f.StringVar(&o.cfg.ServerName, "server-name", "", "server `name`, unique in a cluster (default baton-<port>)")
	f.StringVar(&o.cfg.ClusterName, "cluster-name", "", "join the cluster of this `name`")
	f.IntVar(&o.cfg.ClusterPort, "cluster-port", 0, "route `port` for cluster traffic (with --cluster-name)")
	f.StringVar(&o.routes, "routes", "", "the other nodes, `nats-route://host:port[,...]`")
	f.IntVar(&o.cfg.HTTPPort, "http-port", 0, "monitoring `port`; 0 off")
	addSysFlags(f, &o.cfg)
	f.StringVar(&o.workerUsers, "worker-users", "", "`file` of 'WORKER_ID PASSWORD' lines: one NATS user per worker, allowed only its own lease, load and lifecycle subjects and dispatches (needs --user)")
	f.bindEnv("worker-users", "BATON_NATS_WORKER_USERS", nil)
	f.showDefault("worker-users", "none")
	f.IntVar(&o.cfg.RequestPartitions, "request-partitions", 0, "with --worker-users: grant the workers the `N` streams of a partitioned request log (the components' --request-partitions)")
	f.bindEnv("request-partitions", "BATON_REQUEST_PARTITIONS", nil)
	f.showDefault("request-partitions", "1")
	f.BoolVar(&o.cfg.OutputOnly, "batched-output", false, "with --worker-users, for a fleet whose every frontend and worker runs --batched-output: the worker users may not write the request log's tokens subjects, only their own output streams, so each is bounded by its own limit (--worker-output-max-bytes) and none can fill the log every tenant shares")
	f.bindEnv("batched-output", "BATON_NATS_BATCHED_OUTPUT", nil) // not the components' BATON_BATCHED_OUTPUT: a script that sets that for a whole stack must not confine its workers
	f.StringVar(&o.cfg.ClusterUser, "cluster-user", "", "`user` every route must log in as (with --cluster-password); routes without it are refused")
	f.bindEnv("cluster-user", "BATON_NATS_CLUSTER_USER", nil)
	f.showDefault("cluster-user", "none: any node that reaches the route port may join")
	f.StringVar(&o.cfg.ClusterPassword, "cluster-password", "", "`password` of --cluster-user")
	f.bindEnv("cluster-password", "BATON_NATS_CLUSTER_PASSWORD", nil)
	f.BoolVar(&o.cfg.ClusterInsecure, "cluster-insecure", false, "let routes listen beyond loopback (--host) without route authentication: any node that reaches the route port joins and receives every prompt")
	f.bindEnv("cluster-insecure", "BATON_NATS_CLUSTER_INSECURE", nil)
	f.StringVar(&o.cfg.ClusterTLSCert, "cluster-tls-cert", "", "PEM certificate `file` of this node's routes (with --cluster-tls-key and --cluster-tls-ca): routes are encrypted and verified")
	f.bindEnv("cluster-tls-cert", "BATON_NATS_CLUSTER_TLS_CERT", nil)
	f.StringVar(&o.cfg.ClusterTLSKey, "cluster-tls-key", "", "PEM private key `file` of --cluster-tls-cert")
	f.bindEnv("cluster-tls-key", "BATON_NATS_CLUSTER_TLS_KEY", nil)
	f.StringVar(&o.cfg.ClusterTLSCA, "cluster-tls-ca", "", "PEM CA `file` that signed every node's route certificate")
	f.bindEnv("cluster-tls-ca", "BATON_NATS_CLUSTER_TLS_CA", nil)
	f.StringVar(&o.cfg.User, "user", "", "require this `user` (with --password) for the BATON account; default: anonymous clients are let in")
	f.bindEnv("user", "BATON_NATS_USER", nil)
	f.StringVar(&o.cfg.Password, "password", "", "`password` of --user")
	f.bindEnv("password", "BATON_NATS_PASSWORD", nil)
	if err := f.parse(args); err != nil {
		return nil, err
	}
	for _, r := range strings.Split(o.routes, ",") {
		if r = strings.TrimSpace(r); r != "" {
			o.cfg.Routes = append(o.cfg.Routes, r)
		}
	}
	if o.workerUsers != "" {
		users, err := natsserver.ReadWorkerUsers(o.workerUsers)
		if err != nil {
			return nil, usageError{err}
		}
		o.cfg.WorkerUsers = users
	}
	if o.cfg.HTTPPort < 0 || o.cfg.HTTPPort > 65535 {
		return nil, usagef("--http-port %d out of range", o.cfg.HTTPPort)
	}
	if o.cfg.Port == 0 {
		return nil, usagef("--port 0: want a port, or -1 for a free one")
	}
	return o, badConfig(o.cfg.Validate())
}

func runNATS(ctx context.Context, env *environment, args []string) error {
	o, err := parseNATS(env, args)
	if err != nil {
		return err
	}
	log := o.common.logger(env.stderr, "nats")
	if err := servePprof(ctx, *o.pprof, log); err != nil {
		return err
	}
	if file, err := o.cfg.ResolveSysPassword(); err != nil {
		return err
	} else if file != "" {
		log.Info("system-account password", "user", sysUser(o.cfg.SysUser), "file", file)
	}
	if o.cfg.ClusterName != "" && !natsserver.Loopback(o.cfg.Host) {
		switch {
		case o.cfg.ClusterUser == "":
			log.Warn("routes listen beyond loopback without route authentication (--cluster-insecure): any node that reaches the route port joins and receives every prompt", "host", o.cfg.Host)
		case o.cfg.ClusterTLSCert == "":
			log.Warn("routes listen beyond loopback without route TLS: the route password and every prompt cross the network in clear", "host", o.cfg.Host)
		}
	}
	s, err := natsserver.Start(o.cfg, log)
	if err != nil {
		return fmt.Errorf("start nats: %w", err)
	}
	fmt.Fprintf(env.stdout, "nats listening on %s\n", s.ClientURL())
	<-ctx.Done()
	log.Info("shutting down")
	s.Shutdown()
	s.WaitForShutdown()
	return nil
}

// addSysFlags adds the system-account flags of `baton nats` and `baton up`.
func addSysFlags(f *flagSet, cfg *natsserver.Config) {
	f.StringVar(&cfg.SysUser, "sys-user", natsserver.DefaultSysUser, "system-account `user`")
	f.bindEnv("sys-user", "BATON_NATS_SYS_USER", nil)
	f.StringVar(&cfg.SysPassword, "sys-password", "", "system-account `password`")
	f.bindEnv("sys-password", "BATON_NATS_SYS_PASSWORD", nil)
	f.showDefault("sys-password", "generated at first start, kept in <store-dir>/"+natsserver.SysPasswordFile)
}

func sysUser(u string) string {
	if u == "" {
		return natsserver.DefaultSysUser
	}
	return u
}
