package main

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/baton-dev/baton/internal/freeport"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsNode is one `baton nats` node; restarts keep its name, ports and store.
type natsNode struct {
	name string
	port int
	args []string
	p    *proc
}

func (n *natsNode) url() string { return "nats://127.0.0.1:" + strconv.Itoa(n.port) }

func (h *harness) natsURLs() string {
	var us []string
	for _, n := range h.nodes {
		us = append(us, n.url())
	}
	return strings.Join(us, ",")
}

func (h *harness) sysURLs() string {
	return strings.ReplaceAll(h.natsURLs(), "nats://", "nats://sys:"+h.sysPassword+"@")
}

// startCluster starts three `baton nats` nodes and waits for a meta leader.
func (h *harness) startCluster() error {
	var routes []string
	cports := make([]int, 3)
	for i := range 3 {
		p, err := freeport.Get()
		if err != nil {
			return err
		}
		c, err := freeport.Get()
		if err != nil {
			return err
		}
		cports[i] = c
		h.nodes = append(h.nodes, &natsNode{name: fmt.Sprintf("n%d", i+1), port: p})
		routes = append(routes, "nats-route://127.0.0.1:"+strconv.Itoa(c))
	}
	// Every node has the same system-account password (a client of the
	// system URL list may land on any of them), and routes log in.
	h.sysPassword = secret()
	clusterPassword := secret()
	for i, n := range h.nodes {
		n.args = []string{"nats", "--port", strconv.Itoa(n.port), "--server-name", n.name,
			"--sys-password", h.sysPassword, "--cluster-user", "route", "--cluster-password", clusterPassword,
			"--store-dir", filepath.Join(h.dir, "store", n.name), "--cluster-name", "chaos",
			"--cluster-port", strconv.Itoa(cports[i]), "--routes", strings.Join(routes, ",")}
		if err := h.startNode(n); err != nil {
			return err
		}
	}
	nc, err := nats.Connect(h.natsURLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return fmt.Errorf("connect to the cluster: %w", err)
	}
	h.nc = nc
	h.js, err = jetstream.New(nc)
	if err != nil {
		return err
	}
	return waitUntil(60*time.Second, "a JetStream meta leader", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := h.js.AccountInfo(ctx)
		return err == nil
	})
}

func (h *harness) startNode(n *natsNode) error {
	p, err := h.start(n.name, nil, n.args...)
	if err != nil {
		return err
	}
	n.p = p
	return waitUntil(20*time.Second, n.name+" to listen", func() bool {
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(n.port))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// parts is the request log's layout of the run.
func (h *harness) parts() streams.Partitions { return streams.Partitions(h.cfg.partitions) }

// streamInfo reads the info of stream name (within a second).
func (h *harness) streamInfo(name string) (*jetstream.StreamInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s, err := h.js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	return s.Info(ctx)
}

// requestsLeader returns the node leading request partition k once it has a
// leader and every replica is current.
func (h *harness) requestsLeader(k int, timeout time.Duration) (leader string, followers []string, err error) {
	name := h.parts().Stream(k)
	err = waitUntil(timeout, name+" to have a leader and current replicas", func() bool {
		info, err := h.streamInfo(name)
		if err != nil || info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != len(h.nodes)-1 {
			return false
		}
		followers = followers[:0]
		for _, r := range info.Cluster.Replicas {
			if !r.Current || r.Offline {
				return false
			}
			followers = append(followers, r.Name)
		}
		leader = info.Cluster.Leader
		return true
	})
	return leader, followers, err
}

func (h *harness) node(name string) *natsNode {
	for _, n := range h.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}
