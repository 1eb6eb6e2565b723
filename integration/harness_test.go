package integration

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/internal/redistest"
)

// processes is the production shape the process tests run: a nats-server
// process with JetStream on a store of its own, worker processes, gateway
// processes and, when asked for, one Redis the gateways and workers share;
// the provider the workers call runs in the test.
type processes struct {
	bins     binaries
	dir      string
	natsURL  string
	natsArgs []string
	natsProc *process
	nc       *nats.Conn // the test's own connection
	provider *provider
	redis    *redistest.Server   // nil without Redis
	workers  map[string]*process // by name
	gateways []string            // base URLs, gateway-1 first
	procs    []*process          // the gateway processes, in gateways' order
	configs  map[string]string   // configuration file by process name
}

// processOptions say what startProcesses starts.
type processOptions struct {
	workers   []string      // worker process names; default one named "worker"
	gateways  int           // gateway processes, named gateway-1, gateway-2, …
	firstByte time.Duration // the provider's time to the first byte
	redis     bool          // share one Redis (and one hash key) among all processes
	lease     time.Duration // http.idempotency.lease when set
	// maxAttempts is the policy's max_attempts when set (else 3).
	maxAttempts int
	debug       bool // run workers and gateways at --log-level debug
}

// startProcesses starts nats-server, waits until it takes clients, starts
// the workers and waits until each answers the readiness ping, then starts
// the gateways and waits until each is ready. Every step waits for the one
// before: a process never races its server's start.
func startProcesses(t *testing.T, o processOptions) *processes {
	t.Helper()
	if len(o.workers) == 0 {
		o.workers = []string{"worker"}
	}
	s := &processes{bins: buildBinaries(t), dir: t.TempDir(), provider: newProvider(t, o.firstByte),
		workers: map[string]*process{}, configs: map[string]string{}}
	s.natsURL = "nats://" + freeAddr(t)
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(s.natsURL, "nats://"))
	s.natsArgs = []string{"-a", host, "-p", port, "-js", "-sd", filepath.Join(s.dir, "jetstream")}
	s.natsProc = startProcess(t, s.dir, "nats-server", s.bins.natsServer, s.natsArgs...)
	s.nc = waitNATS(t, s.natsURL)

	var extra string
	if o.redis {
		s.redis = redistest.Start(t)
		// Processes read the hash key from their environment, as in production.
		t.Setenv("HEDGEROW_TEST_HASH_KEY", "replicas-share-this-key")
		extra = fmt.Sprintf("redis:\n  url: %s\n  key_prefix: procs\n  hash_key_env: HEDGEROW_TEST_HASH_KEY\n", s.redis.URL())
	}
	var logArgs []string
	if o.debug {
		logArgs = []string{"--log-level", "debug"}
	}
	writeConfig := func(name, listen string) string {
		y := fmt.Sprintf(processConfigYAML, s.natsURL, listen, s.provider.baseURL(name), processDeadline) + extra
		if o.lease > 0 {
			y = strings.Replace(y, "  body_limit: 512KiB\n", fmt.Sprintf("  body_limit: 512KiB\n  idempotency: {lease: %s}\n", o.lease), 1)
		}
		if o.maxAttempts > 0 {
			y = strings.Replace(y, "    max_attempts: 3\n", fmt.Sprintf("    max_attempts: %d\n", o.maxAttempts), 1)
		}
		path := filepath.Join(s.dir, name+".yaml")
		if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		s.configs[name] = path
		return path
	}
	var started []*process
	for _, name := range o.workers {
		args := append([]string{"worker", "--config", writeConfig(name, "127.0.0.1:0"), "--nats", s.natsURL}, logArgs...)
		s.workers[name] = startProcess(t, s.dir, name, s.bins.hedgerow, args...)
		started = append(started, s.workers[name])
	}
	waitWorkers(t, s.nc, len(o.workers), started...)
	for i := range o.gateways {
		name, addr := fmt.Sprintf("gateway-%d", i+1), freeAddr(t)
		args := append([]string{"gateway", "--config", writeConfig(name, addr), "--nats", s.natsURL}, logArgs...)
		s.procs = append(s.procs, startProcess(t, s.dir, name, s.bins.hedgerow, args...))
		s.gateways = append(s.gateways, "http://"+addr)
	}
	for _, g := range s.gateways {
		waitReady(t, g)
	}
	return s
}

// restartNATS kills the nats-server process with SIGKILL and starts a new
// one on the same address and JetStream store, returning a connection to it.
func (s *processes) restartNATS(t *testing.T) *nats.Conn {
	t.Helper()
	s.natsProc.kill(t)
	s.natsProc = startProcess(t, s.dir, "nats-server-restarted", s.bins.natsServer, s.natsArgs...)
	return waitNATS(t, s.natsURL)
}
