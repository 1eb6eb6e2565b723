package cluster

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/internal/natsauth"
)

// The parts of a local deployment, as Up plans them; other launchers of
// local deployments (internal/tools/regions) plan theirs from the same
// pieces, so a part runs and is probed the same way wherever it starts.

// Addr is 127.0.0.1:port.
func Addr(port int) string { return addr(port) }

// RedisPart is a redis-server on port with AOF on, its data in dataDir
// (created).
func RedisPart(name, redisServer string, port int, dataDir string) (Part, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return Part{}, fmt.Errorf("cluster: %w", err)
	}
	return Part{Name: name, Args: []string{redisServer,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dataDir,
		"--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no", "--protected-mode", "yes"},
		Ready: "redis://" + addr(port), Ports: []int{port}}, nil
}

// FakeLLMParts are the simulated routes, one fakellm on each port (the
// i-th is Routes[i]), their time scaled by timeScale (0 is 1).
func FakeLLMParts(hedgerow string, ports []int, timeScale float64) []Part {
	if timeScale <= 0 {
		timeScale = 1
	}
	var parts []Part
	for i, r := range Routes {
		parts = append(parts, Part{Name: fakeName(r), Args: []string{hedgerow, "fakellm",
			"--listen", addr(ports[i]), "--workload", "gpt4o", "--seed", strconv.Itoa(i + 1), "--route", strconv.Itoa(i),
			"--time-scale", strconv.FormatFloat(timeScale, 'g', -1, 64)},
			Ready: fmt.Sprintf("http://%s/healthz", addr(ports[i])), Ports: []int{ports[i]}})
	}
	return parts
}

// ProxyPart is a faultproxy on port forwarding to upstream (host:port),
// its control API on control, each way delayed by delay.
func ProxyPart(name, hedgerow string, port int, upstream string, control int, delay time.Duration) Part {
	args := []string{hedgerow, "faultproxy", "--listen", addr(port), "--upstream", upstream, "--control", addr(control)}
	if delay > 0 {
		args = append(args, "--delay", delay.String())
	}
	return Part{Name: name, Args: args, Ready: fmt.Sprintf("http://%s/healthz", addr(control)), Ports: []int{port, control}}
}

// WorkerPart is a worker on configuration file config, its metrics on
// metricsPort.
func WorkerPart(name, hedgerow, config string, metricsPort int) Part {
	return Part{Name: name, Args: []string{hedgerow, "worker", "--config", config,
		"--metrics-listen", addr(metricsPort), "--shutdown-timeout", "10s"},
		Ready: fmt.Sprintf("http://%s/metrics", addr(metricsPort)), Ports: []int{metricsPort}}
}

// GatewayPart is a gateway on configuration file config, ready when
// ready (its /readyz) answers, listening on ports; its hash key is read
// from the state directory's secrets.
func GatewayPart(name, hedgerow, config, ready string, ports ...int) Part {
	return Part{Name: name, Args: []string{hedgerow, "gateway", "--config", config, "--shutdown-timeout", "10s"},
		Env: map[string]string{hashKeyEnv: "@" + hashKeyFile}, Ready: ready, Ports: ports}
}

// WriteHashKey writes the gateways' hash key into dir's secrets, once: a
// deployment brought up again keeps it.
func WriteHashKey(dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(hashKeyFile)), 0o700); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	key := filepath.Join(dir, hashKeyFile)
	if _, err := os.Stat(key); !errors.Is(err, os.ErrNotExist) {
		if err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
		return nil
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if err := os.WriteFile(key, []byte(hex.EncodeToString(raw)+"\n"), 0o600); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	return nil
}

// HashKeyFile is the gateways' hash key in a state directory.
func HashKeyFile(dir string) string { return filepath.Join(dir, hashKeyFile) }

// NATSNode is one nats-server of a local deployment: JetStream (every
// write fsynced), the users and TLS of the natsauth directory AuthDir,
// and, with Cluster, routes (TLS both ways with the servers' certificate).
type NATSNode struct {
	// Title heads the file.
	Title string
	Name  string
	// Listen, Monitor and RouteListen are host:port addresses.
	Listen, Monitor string
	StoreDir        string
	AuthDir         string
	// Cluster names the node's cluster; empty: no cluster block.
	Cluster     string
	RouteListen string
	Routes      []string
	// Includes are further files the configuration includes (a region's
	// gateway block), by absolute path.
	Includes []string
}

// Config is the node's configuration, to be written into the directory
// confDir (nats-server resolves includes relative to the including file);
// the store directory is created.
func (n NATSNode) Config(confDir string) (string, error) {
	if err := os.MkdirAll(n.StoreDir, 0o700); err != nil {
		return "", fmt.Errorf("cluster: %w", err)
	}
	var includes []string
	for _, inc := range append([]string{filepath.Join(n.AuthDir, natsauth.ServerConfigFile)}, n.Includes...) {
		rel, err := filepath.Rel(confDir, inc)
		if err != nil {
			return "", fmt.Errorf("cluster: include %s: %w", inc, err)
		}
		includes = append(includes, rel)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `# %[1]s.
server_name: %[2]s
listen: %[3]q
http: %[4]q
max_payload: 8MB
# Every write fsynced before its ack: the gate's ledger must outlive an OS crash (docs/architecture.md §6).
jetstream {store_dir: %[5]q, max_memory_store: 256MB, max_file_store: 2GB, sync_interval: always}
`, n.Title, n.Name, n.Listen, n.Monitor, n.StoreDir)
	for _, inc := range includes {
		fmt.Fprintf(&b, "include %q\n", inc)
	}
	if n.Cluster != "" {
		var routes []string
		for _, r := range n.Routes {
			routes = append(routes, strconv.Quote(r))
		}
		tlsDir := filepath.Join(n.AuthDir, natsauth.TLSDir)
		fmt.Fprintf(&b, `cluster {
  name: %q
  listen: %q
  routes: [%s]
  tls {cert_file: %q, key_file: %q, ca_file: %q, verify: true, timeout: 2}
}
`, n.Cluster, n.RouteListen, strings.Join(routes, ", "),
			filepath.Join(tlsDir, natsauth.ServerCertFile), filepath.Join(tlsDir, natsauth.ServerKeyFile), filepath.Join(tlsDir, natsauth.CAFile))
	}
	return b.String(), nil
}

// Part is the node run from natsServer on its configuration file conf,
// ready when its monitor's /healthz answers, listening on ports.
func (n NATSNode) Part(natsServer, conf string, ports ...int) Part {
	return Part{Name: n.Name, Args: []string{natsServer, "-c", conf}, Ready: "http://" + n.Monitor + "/healthz", Ports: ports}
}

// ProcessConfig is a gateway's or worker's configuration in a local
// deployment: NATS as User with its nkey and certificate from AuthDir,
// Redis, the Routes (fakellm on FakeLLM) in pool Pool, the policy and
// the tenant "local" with key TenantKey.
type ProcessConfig struct {
	// Title heads the file.
	Title    string
	User     string
	AuthDir  string
	NATSURLs []string
	// Redis is host:port.
	Redis            string
	Listen, Internal string
	// Replicas of the gate's bucket and the records stream.
	Replicas int
	FakeLLM  []int
	// RouteLimits, when set, is every route's limits (a YAML flow map).
	RouteLimits string
	// Tenant adds fields to the tenant's map (YAML flow entries).
	Tenant string
	// Extra is appended at the top level (YAML).
	Extra string
}

// YAML is the configuration file.
func (c ProcessConfig) YAML() string {
	tlsDir := filepath.Join(c.AuthDir, natsauth.TLSDir)
	var b strings.Builder
	fmt.Fprintf(&b, "# %s.\n", c.Title)
	fmt.Fprintf(&b, "nats:\n  urls: [%s]\n  nkey_seed_file: %q\n", strings.Join(c.NATSURLs, ", "), filepath.Join(c.AuthDir, c.User+".nk"))
	fmt.Fprintf(&b, "  tls: {ca_file: %q, cert_file: %q, key_file: %q, server_name: localhost}\n",
		filepath.Join(tlsDir, natsauth.CAFile), filepath.Join(tlsDir, natsauth.ClientCertFile(c.User)), filepath.Join(tlsDir, natsauth.ClientKeyFile(c.User)))
	fmt.Fprintf(&b, "redis:\n  url: redis://%s/0\n  key_prefix: hrlocal\n", c.Redis)
	if c.User == natsauth.UserGateway {
		fmt.Fprintf(&b, "  hash_key_env: %s\n", hashKeyEnv)
	}
	fmt.Fprintf(&b, "gate: {replicas: %d}\nrecords: {replicas: %d}\n", c.Replicas, c.Replicas)
	fmt.Fprintf(&b, "http:\n  listen: %s\n", c.Listen)
	if c.Internal != "" {
		fmt.Fprintf(&b, "  internal_listen: %s\n", c.Internal)
	}
	fmt.Fprintf(&b, "  idempotency: {lease: %s}\n", idempotencyLease)
	b.WriteString("routes:\n")
	for i, r := range Routes {
		limits := ""
		if c.RouteLimits != "" {
			limits = ", limits: " + c.RouteLimits
		}
		fmt.Fprintf(&b, "  - {name: %s, provider: openai, base_url: \"http://%s/v1\", model: fake-gpt4o, labels: {region: %s}%s}\n",
			r, addr(c.FakeLLM[i]), strings.TrimPrefix(r, "fake-"), limits)
	}
	fmt.Fprintf(&b, "pools:\n  %s:\n    routes: [%s]\n", Pool, strings.Join(Routes, ", "))
	fmt.Fprintf(&b, `policies:
  default:
    max_attempts: 3
    deadline: %s
    accept_timeout: 500ms
    heartbeat_interval: %s
    heartbeat_timeout: %s
    stall_after_first_token: 2s
`, Deadline, heartbeat, heartbeatTimeout)
	sum := sha256.Sum256([]byte(TenantKey))
	tenant := ""
	if c.Tenant != "" {
		tenant = ", " + c.Tenant
	}
	fmt.Fprintf(&b, "tenants:\n  local: {api_key_hashes: [\"sha256:%s\"]%s}\n", hex.EncodeToString(sum[:]), tenant)
	b.WriteString(c.Extra)
	return b.String()
}
