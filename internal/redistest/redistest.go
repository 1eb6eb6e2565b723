// Package redistest starts real redis-server processes for tests: a
// standalone server, or a three-master Redis Cluster built with
// `redis-cli --cluster create`. Each process listens on a free loopback port,
// keeps nothing on disk and is killed by the test's cleanup.
//
// A missing redis-server or redis-cli fails the test with a message that
// says how to install them; `make test` installs them when they are absent.
// Nothing here skips.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startTimeout bounds the wait for a server to accept connections and for
// a cluster to agree that every slot is served.
const startTimeout = 20 * time.Second

// missingHint is appended to the error when a binary is not on PATH.
const missingHint = "install it with `apt-get install redis-server redis-tools` (make test does this when it is missing)"

// Server is one redis-server process.
type Server struct {
	t    testing.TB
	port int
	args []string
	dir  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs a standalone redis-server on a free loopback port and kills it
// when the test ends. Extra arguments go to redis-server as they are, e.g.
// "--user", "app", "on", ">secret", "~*", "+@all" for an ACL user (redis-server
// joins the words after an option into one configuration line).
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	s, err := startOnAFreePort(t, extra...)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return s
}

// portTries is how many free ports a server is tried on: between asking
// the kernel for a port and redis-server binding it (and, in a cluster, the
// port + 10000 of its bus) another process may take it, which on a busy
// machine running many test packages happens.
const portTries = 4

// startOnAFreePort starts a server with extra arguments, on a new free
// port each time one exits before it was ready.
func startOnAFreePort(t testing.TB, extra ...string) (*Server, error) {
	t.Helper()
	var err error
	for range portTries {
		s := newServer(t, extra...)
		if err = s.start(); err == nil {
			return s, nil
		}
	}
	return nil, err
}

func newServer(t testing.TB, extra ...string) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redistest: redis-server not found on PATH: %s", missingHint)
	}
	port, err := freePort()
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	dir := t.TempDir()
	args := append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--logfile", "", "--daemonize", "no", "--protected-mode", "no",
	}, extra...)
	s := &Server{t: t, port: port, args: args, dir: dir}
	t.Cleanup(s.Kill)
	return s
}

// Addr is the server's "host:port".
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// URL is the server's redis:// URL.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Client returns a client of the server, closed when the test ends.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Kill stops the server at once (SIGKILL) and waits for it to exit. Killing
// a stopped server does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Restart starts a killed server again on the same port, empty: like a
// Redis that lost its memory in a crash.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatalf("redistest: restart: %v", err)
	}
}

// start runs the process and returns once its log says it accepts
// connections.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("server is already running")
	}
	cmd := exec.Command("redis-server", s.args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("redis-server stdout: %w", err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	ready := make(chan struct{})
	var logTail strings.Builder
	var logMu sync.Mutex
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(out)
		signalled := false
		for sc.Scan() {
			line := sc.Text()
			logMu.Lock()
			if logTail.Len() < 4096 {
				logTail.WriteString(line + "\n")
			}
			logMu.Unlock()
			if !signalled && strings.Contains(line, "Ready to accept connections") {
				signalled = true
				close(ready)
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	done := make(chan struct{})
	go func() {
		<-scanned
		_ = cmd.Wait()
		close(done)
	}()
	select {
	case <-ready:
	case <-done:
		logMu.Lock()
		defer logMu.Unlock()
		return fmt.Errorf("redis-server on port %d exited before it was ready:\n%s", s.port, logTail.String())
	case <-time.After(startTimeout):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("redis-server on port %d not ready after %v", s.port, startTimeout)
	}
	s.cmd, s.done = cmd, done
	return nil
}

// Cluster is a Redis Cluster of three masters and no replicas.
type Cluster struct {
	t       testing.TB
	servers []*Server
}

// StartCluster runs three cluster-enabled redis-servers, joins them with
// `redis-cli --cluster create` and waits until every node reports the
// cluster ok. The processes are killed when the test ends.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatalf("redistest: redis-cli not found on PATH: %s", missingHint)
	}
	c := &Cluster{t: t}
	for i := 0; i < 3; i++ {
		s, err := startOnAFreePort(t, "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(t.TempDir(), "nodes.conf"),
			"--cluster-node-timeout", "5000")
		if err != nil {
			t.Fatalf("redistest: cluster node %d: %v", i, err)
		}
		c.servers = append(c.servers, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.waitOK(ctx); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return c
}

// Addrs are the masters' "host:port" addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.servers))
	for i, s := range c.servers {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Client returns a cluster client, closed when the test ends.
func (c *Cluster) Client() *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	c.t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// waitOK polls CLUSTER INFO on every node until all report cluster_state:ok:
// the nodes learn of each other by gossip, with no event to wait on.
func (c *Cluster) waitOK(ctx context.Context) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ok := true
		for _, s := range c.servers {
			cl := redis.NewClient(&redis.Options{Addr: s.Addr()})
			info, err := cl.ClusterInfo(ctx).Result()
			_ = cl.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				ok = false
				break
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster %v not ok: %w", c.Addrs(), ctx.Err())
		case <-tick.C:
		}
	}
}

// freePort asks the kernel for a free loopback port below 55536, so that a
// cluster node's bus port (port + 10000) exists. Another process may take
// it before redis-server binds; startOnAFreePort then tries another.
func freePort() (int, error) {
	for range 16 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if port < 55536 {
			return port, nil
		}
	}
	return 0, errors.New("free port: the kernel gave only ports above 55535")
}
