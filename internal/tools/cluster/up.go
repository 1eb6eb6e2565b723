package cluster

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hedgerow/hedgerow/internal/natsauth"
)

// Files under the state directory.
const (
	authDir     = "nats-auth"         // natsauth's users, secrets and TLS
	hashKeyFile = "secrets/hash-key"  // the gateways' redis.hash_key_env
	hashKeyEnv  = "HEDGEROW_HASH_KEY" // the variable that carries it
)

// Policy bounds of the cluster's one operation class, short enough that
// a fault's failures reach their callers within seconds.
const (
	Deadline         = 10 * time.Second
	heartbeat        = 250 * time.Millisecond
	heartbeatTimeout = time.Second
	idempotencyLease = 3 * time.Second
)

// Up writes dir's configurations and credentials (kept from an earlier
// run) and starts every part, returning once each is ready or at the
// first failure, having then stopped what it started. A cluster already
// up in dir is an error.
func Up(ctx context.Context, s Spec, out io.Writer) (err error) {
	if err := s.validate(); err != nil {
		return err
	}
	if IsUp(s.Dir) {
		return fmt.Errorf("cluster: already up in %s (make cluster-down first)", s.Dir)
	}
	if _, err := ReadManifest(s.Dir); err == nil {
		// A cluster partly down: stop what is left before starting anew.
		if err := Down(s.Dir, out); err != nil {
			return err
		}
	}
	// Parts run in the state directory: binaries by absolute path.
	for _, b := range []*string{&s.Hedgerow, &s.NATSServer, &s.RedisServer, &s.Prometheus} {
		if *b == "" {
			continue
		}
		if _, err := os.Stat(*b); err != nil {
			return fmt.Errorf("cluster: binary: %w", err)
		}
		if *b, err = filepath.Abs(*b); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
	}
	if s.Alerts != "" {
		if _, err := os.Stat(s.Alerts); err != nil {
			return fmt.Errorf("cluster: alert rules: %w", err)
		}
	}
	for _, d := range []string{s.Dir, filepath.Join(s.Dir, "logs"), filepath.Join(s.Dir, "secrets")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
	}
	abs, err := filepath.Abs(s.Dir)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	s.Dir = abs
	if err := portsFree(s.Ports.all(), 0); err != nil {
		return fmt.Errorf("%w (another cluster, or something else, holds them)", err)
	}
	if err := writeCredentials(s); err != nil {
		return err
	}
	m := &Manifest{Spec: s}
	if err := m.plan(); err != nil {
		return err
	}
	if err := m.write(); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = m.down(io.Discard)
		}
	}()
	// Stages: each starts its parts at once and waits for all of them.
	var natsParts, fakes, workers, gateways []string
	for _, p := range m.Parts {
		switch {
		case strings.HasPrefix(p.Name, "nats-"):
			natsParts = append(natsParts, p.Name)
		case strings.HasPrefix(p.Name, "fakellm-"):
			fakes = append(fakes, p.Name)
		case strings.HasPrefix(p.Name, "worker-"):
			workers = append(workers, p.Name)
		case strings.HasPrefix(p.Name, "gateway-"):
			gateways = append(gateways, p.Name)
		}
	}
	first := append(append(append([]string{RedisName}, natsParts...), fakes...), ProxyName)
	if s.Prometheus != "" {
		first = append(first, PrometheusName)
	}
	// Gateways one after the other: the first creates the gate's bucket
	// and the records stream. Two creating one R3 stream at once on
	// different servers of a new cluster left a creation unanswered for
	// its whole 10 s bound (nats-server 2.15.2), and the gateway exited.
	stages := [][]string{first, workers}
	for _, g := range gateways {
		stages = append(stages, []string{g})
	}
	for i, stage := range stages {
		if err := m.startAll(ctx, stage, out); err != nil {
			return err
		}
		if i == 0 {
			wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			err := m.waitStreams(wctx)
			cancel()
			if err != nil {
				return err
			}
		}
	}
	if s.Prometheus != "" && s.Alerts != "" {
		return checkRules(ctx, addr(s.Ports.Prometheus), s.Alerts, out)
	}
	return nil
}

// checkRules asks Prometheus for its rule groups: the alert rules must
// have loaded (a rule file Prometheus cannot read stops it at start).
func checkRules(ctx context.Context, promAddr, file string, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+promAddr+"/api/v1/rules", nil)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("cluster: prometheus rules: %w", err)
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Groups []struct {
				Name  string            `json:"name"`
				Rules []json.RawMessage `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("cluster: prometheus rules: %w", err)
	}
	rules := 0
	for _, g := range body.Data.Groups {
		rules += len(g.Rules)
	}
	if rules == 0 {
		return fmt.Errorf("cluster: prometheus loaded no rule from %s", file)
	}
	fmt.Fprintf(out, "%-18s %d alert rules loaded in %d groups from %s\n", PrometheusName, rules, len(body.Data.Groups), file)
	return nil
}

// startAll starts the named parts together and waits until each is ready.
func (m *Manifest) startAll(ctx context.Context, names []string, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(names))
	for i, name := range names {
		p, ok := m.Part(name)
		if !ok {
			return fmt.Errorf("cluster: no part %q", name)
		}
		exited, err := p.start(m.Spec.Dir)
		if err == nil {
			err = m.write() // every pid on disk before anything can fail
		}
		if err != nil {
			wg.Wait()
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.waitReady(ctx, m.Spec.Dir, exited)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, name := range names {
		p, _ := m.Part(name)
		fmt.Fprintf(out, "%-18s ready  pid %-7d %s\n", p.Name, p.Pid, p.Ready)
	}
	return nil
}

// writeCredentials generates the NATS users with TLS and the gateways'
// hash key, once: a cluster brought up again keeps its credentials.
func writeCredentials(s Spec) error {
	auth := filepath.Join(s.Dir, authDir)
	if _, err := os.Stat(filepath.Join(auth, natsauth.ServerConfigFile)); errors.Is(err, os.ErrNotExist) {
		spec := natsauth.Spec{
			Routes:    Routes,
			Responses: natsauth.ResponsesFor(Deadline, heartbeat),
			TLS:       &natsauth.TLSSpec{},
		}
		b, err := natsauth.Generate(spec)
		if err != nil {
			return err
		}
		if err := b.Write(auth); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	key := filepath.Join(s.Dir, hashKeyFile)
	if _, err := os.Stat(key); errors.Is(err, os.ErrNotExist) {
		raw := make([]byte, 32)
		if _, err := rand.Read(raw); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
		if err := os.WriteFile(key, []byte(hex.EncodeToString(raw)+"\n"), 0o600); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
	}
	return nil
}

// plan writes every part's configuration and fills the manifest, in
// start order.
func (m *Manifest) plan() error {
	s, p := m.Spec, m.Spec.Ports
	write := func(name, data string) (string, error) {
		path := filepath.Join(s.Dir, name)
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			return "", fmt.Errorf("cluster: %w", err)
		}
		return path, nil
	}
	// Redis: AOF on, its data in the state directory.
	redisDir := filepath.Join(s.Dir, "redis")
	if err := os.MkdirAll(redisDir, 0o700); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	m.Parts = append(m.Parts, Part{Name: RedisName, Args: []string{s.RedisServer,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(p.Redis), "--dir", redisDir,
		"--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no", "--protected-mode", "yes"},
		Ready: "redis://" + addr(p.Redis), Ports: []int{p.Redis}})
	// NATS: a cluster of every node, JetStream on, the generated users and TLS.
	var routes []string
	for i := range p.NATS {
		routes = append(routes, fmt.Sprintf("%q", "tls://"+addr(p.NATSRoute[i])))
	}
	tlsDir := filepath.Join(s.Dir, authDir, natsauth.TLSDir)
	for i := range p.NATS {
		name := natsName(i)
		store := filepath.Join(s.Dir, "jetstream", name)
		if err := os.MkdirAll(store, 0o700); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
		conf := fmt.Sprintf(`# %[1]s of the local hedgerow cluster, written by hedgerow cluster up.
server_name: %[1]s
listen: %[2]q
http: %[3]q
max_payload: 8MB
# Every write fsynced before its ack: the gate's ledger must outlive an OS crash (docs/architecture.md §6).
jetstream {store_dir: %[4]q, max_memory_store: 256MB, max_file_store: 2GB, sync_interval: always}
include %[5]q
`, name, addr(p.NATS[i]), addr(p.NATSMonitor[i]), store, authDir+"/"+natsauth.ServerConfigFile)
		if len(p.NATS) > 1 {
			conf += fmt.Sprintf(`cluster {
  name: hedgerow-local
  listen: %q
  routes: [%s]
  tls {cert_file: %q, key_file: %q, ca_file: %q, verify: true, timeout: 2}
}
`, addr(p.NATSRoute[i]), strings.Join(routes, ", "),
				filepath.Join(tlsDir, natsauth.ServerCertFile), filepath.Join(tlsDir, natsauth.ServerKeyFile), filepath.Join(tlsDir, natsauth.CAFile))
		}
		path, err := write(name+".conf", conf)
		if err != nil {
			return err
		}
		ready := fmt.Sprintf("http://%s/healthz", addr(p.NATSMonitor[i]))
		m.Parts = append(m.Parts, Part{Name: name, Args: []string{s.NATSServer, "-c", path}, Ready: ready,
			Ports: []int{p.NATS[i], p.NATSRoute[i], p.NATSMonitor[i]}})
	}
	// The simulated routes.
	for i, r := range Routes {
		ts := s.TimeScale
		if ts <= 0 {
			ts = 1
		}
		m.Parts = append(m.Parts, Part{Name: fakeName(r), Args: []string{s.Hedgerow, "fakellm",
			"--listen", addr(p.FakeLLM[i]), "--workload", "gpt4o", "--seed", strconv.Itoa(i + 1), "--route", strconv.Itoa(i),
			"--time-scale", strconv.FormatFloat(ts, 'g', -1, 64)},
			Ready: fmt.Sprintf("http://%s/healthz", addr(p.FakeLLM[i])), Ports: []int{p.FakeLLM[i]}})
	}
	// The fault proxy in front of Redis for the first gateway.
	m.Parts = append(m.Parts, Part{Name: ProxyName, Args: []string{s.Hedgerow, "faultproxy",
		"--listen", addr(p.RedisProxy), "--upstream", addr(p.Redis), "--control", addr(p.RedisProxyControl)},
		Ready: fmt.Sprintf("http://%s/healthz", addr(p.RedisProxyControl)), Ports: []int{p.RedisProxy, p.RedisProxyControl}})
	if s.Prometheus != "" {
		if err := m.planPrometheus(write); err != nil {
			return err
		}
	}
	var natsURLs []string
	for _, port := range p.NATS {
		natsURLs = append(natsURLs, "tls://"+addr(port))
	}
	for i := range s.Workers {
		name := workerName(i)
		path, err := write(name+".yaml", m.hedgerowConfig(name, natsauth.UserWorker, natsURLs, addr(p.Redis), "127.0.0.1:0", ""))
		if err != nil {
			return err
		}
		m.Parts = append(m.Parts, Part{Name: name, Args: []string{s.Hedgerow, "worker", "--config", path,
			"--metrics-listen", addr(p.WorkerMetrics[i]), "--shutdown-timeout", "10s"},
			Ready: fmt.Sprintf("http://%s/metrics", addr(p.WorkerMetrics[i])), Ports: []int{p.WorkerMetrics[i]}})
	}
	for i := range s.Gateways {
		name := gatewayName(i)
		redisAddr := addr(p.Redis)
		if i == 0 {
			redisAddr = addr(p.RedisProxy)
		}
		path, err := write(name+".yaml", m.hedgerowConfig(name, natsauth.UserGateway, natsURLs, redisAddr,
			addr(p.Gateways[i]), addr(p.GatewayInternal[i])))
		if err != nil {
			return err
		}
		m.Parts = append(m.Parts, Part{Name: name, Args: []string{s.Hedgerow, "gateway", "--config", path, "--shutdown-timeout", "10s"},
			Env:   map[string]string{hashKeyEnv: "@" + hashKeyFile},
			Ready: fmt.Sprintf("http://%s/readyz", addr(p.GatewayInternal[i])), Ports: []int{p.Gateways[i], p.GatewayInternal[i]}})
	}
	return nil
}

// hedgerowConfig is a gateway's or worker's configuration: the NATS
// cluster as user with its certificate, Redis at redisAddr, the three
// routes in pool general, the tenant "local".
func (m *Manifest) hedgerowConfig(name, user string, natsURLs []string, redisAddr, listen, internal string) string {
	s, p := m.Spec, m.Spec.Ports
	auth := filepath.Join(s.Dir, authDir)
	tlsDir := filepath.Join(auth, natsauth.TLSDir)
	replicas := 1
	if len(p.NATS) >= 3 {
		replicas = 3
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# %s of the local hedgerow cluster, written by hedgerow cluster up.\n", name)
	fmt.Fprintf(&b, "nats:\n  urls: [%s]\n  nkey_seed_file: %q\n", strings.Join(natsURLs, ", "), filepath.Join(auth, user+".nk"))
	fmt.Fprintf(&b, "  tls: {ca_file: %q, cert_file: %q, key_file: %q, server_name: localhost}\n",
		filepath.Join(tlsDir, natsauth.CAFile), filepath.Join(tlsDir, natsauth.ClientCertFile(user)), filepath.Join(tlsDir, natsauth.ClientKeyFile(user)))
	fmt.Fprintf(&b, "redis:\n  url: redis://%s/0\n  key_prefix: hrlocal\n", redisAddr)
	if user == natsauth.UserGateway {
		fmt.Fprintf(&b, "  hash_key_env: %s\n", hashKeyEnv)
	}
	fmt.Fprintf(&b, "gate: {replicas: %d}\nrecords: {replicas: %d}\n", replicas, replicas)
	fmt.Fprintf(&b, "http:\n  listen: %s\n", listen)
	if internal != "" {
		fmt.Fprintf(&b, "  internal_listen: %s\n", internal)
	}
	fmt.Fprintf(&b, "  idempotency: {lease: %s}\n", idempotencyLease)
	b.WriteString("routes:\n")
	for i, r := range Routes {
		fmt.Fprintf(&b, "  - {name: %s, provider: openai, base_url: \"http://%s/v1\", model: fake-gpt4o, labels: {region: %s}}\n",
			r, addr(p.FakeLLM[i]), strings.TrimPrefix(r, "fake-"))
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
	fmt.Fprintf(&b, "tenants:\n  local:\n    api_key_hashes: [\"sha256:%s\"]\n", hex.EncodeToString(sum[:]))
	return b.String()
}

// planPrometheus writes Prometheus' configuration: every hedgerow
// process's /metrics (gateways' internal listeners, workers), itself, and
// the alert rules when given.
func (m *Manifest) planPrometheus(write func(name, data string) (string, error)) error {
	s, p := m.Spec, m.Spec.Ports
	var gws, wks []string
	for _, port := range p.GatewayInternal {
		gws = append(gws, strconv.Quote(addr(port)))
	}
	for _, port := range p.WorkerMetrics {
		wks = append(wks, strconv.Quote(addr(port)))
	}
	var b strings.Builder
	b.WriteString("# Prometheus of the local hedgerow cluster, written by hedgerow cluster up.\n")
	b.WriteString("global: {scrape_interval: 5s, evaluation_interval: 5s}\n")
	ready := fmt.Sprintf("http://%s/-/ready", addr(p.Prometheus))
	if s.Alerts != "" {
		rules, err := filepath.Abs(s.Alerts)
		if err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
		fmt.Fprintf(&b, "rule_files: [%q]\n", rules)
	}
	fmt.Fprintf(&b, `scrape_configs:
  - job_name: hedgerow-gateway
    static_configs: [{targets: [%s]}]
  - job_name: hedgerow-worker
    static_configs: [{targets: [%s]}]
  - job_name: prometheus
    static_configs: [{targets: [%q]}]
`, strings.Join(gws, ", "), strings.Join(wks, ", "), addr(p.Prometheus))
	path, err := write("prometheus.yml", b.String())
	if err != nil {
		return err
	}
	data := filepath.Join(s.Dir, "prometheus")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	m.Parts = append(m.Parts, Part{Name: PrometheusName, Args: []string{s.Prometheus,
		"--config.file=" + path, "--storage.tsdb.path=" + data, "--web.listen-address=" + addr(p.Prometheus),
		"--storage.tsdb.retention.time=1d"},
		Ready: ready, Ports: []int{p.Prometheus}})
	return nil
}
