package cluster

import (
	"context"
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
			_ = m.Down(io.Discard)
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
		if err := m.StartAll(ctx, stage, out); err != nil {
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

// StartAll starts the named parts together (the manifest written) and
// waits until each is ready, within a minute.
func (ps *Procs) StartAll(ctx context.Context, names []string, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(names))
	for i, name := range names {
		p, ok := ps.Part(name)
		if !ok {
			return fmt.Errorf("cluster: no part %q", name)
		}
		exited, err := p.start(ps.Dir)
		if err == nil {
			err = ps.save() // every pid on disk before anything can fail
		}
		if err != nil {
			wg.Wait()
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.waitReady(ctx, ps.Dir, exited)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, name := range names {
		p, _ := ps.Part(name)
		fmt.Fprintf(out, "%-18s ready  pid %-7d %s\n", p.Name, p.Pid, p.Ready)
	}
	return nil
}

// UsersSpec is the NATS users of a local deployment: one worker user of
// every route, their replies bounded by the policy's deadline.
func UsersSpec() natsauth.Spec {
	return natsauth.Spec{Routes: Routes, Responses: natsauth.ResponsesFor(Deadline, heartbeat)}
}

// writeCredentials generates the NATS users with TLS and the gateways'
// hash key, once: a cluster brought up again keeps its credentials.
func writeCredentials(s Spec) error {
	auth := filepath.Join(s.Dir, authDir)
	if _, err := os.Stat(filepath.Join(auth, natsauth.ServerConfigFile)); errors.Is(err, os.ErrNotExist) {
		spec := UsersSpec()
		spec.TLS = &natsauth.TLSSpec{}
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
	return WriteHashKey(s.Dir)
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
	redis, err := RedisPart(RedisName, s.RedisServer, p.Redis, filepath.Join(s.Dir, "redis"))
	if err != nil {
		return err
	}
	m.Parts = append(m.Parts, redis)
	// NATS: a cluster of every node, JetStream on, the generated users and TLS.
	var routes []string
	for i := range p.NATS {
		routes = append(routes, "tls://"+addr(p.NATSRoute[i]))
	}
	for i := range p.NATS {
		name := natsName(i)
		node := NATSNode{Title: name + " of the local hedgerow cluster, written by hedgerow cluster up", Name: name,
			Listen: addr(p.NATS[i]), Monitor: addr(p.NATSMonitor[i]), StoreDir: filepath.Join(s.Dir, "jetstream", name),
			AuthDir: filepath.Join(s.Dir, authDir)}
		if len(p.NATS) > 1 {
			node.Cluster, node.RouteListen, node.Routes = "hedgerow-local", addr(p.NATSRoute[i]), routes
		}
		conf, err := node.Config(s.Dir)
		if err != nil {
			return err
		}
		path, err := write(name+".conf", conf)
		if err != nil {
			return err
		}
		m.Parts = append(m.Parts, node.Part(s.NATSServer, path, p.NATS[i], p.NATSRoute[i], p.NATSMonitor[i]))
	}
	// The simulated routes.
	m.Parts = append(m.Parts, FakeLLMParts(s.Hedgerow, p.FakeLLM, s.TimeScale)...)
	// The fault proxy in front of Redis for the first gateway.
	m.Parts = append(m.Parts, ProxyPart(ProxyName, s.Hedgerow, p.RedisProxy, addr(p.Redis), p.RedisProxyControl, 0))
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
		m.Parts = append(m.Parts, WorkerPart(name, s.Hedgerow, path, p.WorkerMetrics[i]))
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
		m.Parts = append(m.Parts, GatewayPart(name, s.Hedgerow, path, "http://"+addr(p.GatewayInternal[i])+"/readyz", p.Gateways[i], p.GatewayInternal[i]))
	}
	return nil
}

// hedgerowConfig is a gateway's or worker's configuration: the NATS
// cluster as user with its certificate, Redis at redisAddr, the three
// routes in pool general, the tenant "local".
func (m *Manifest) hedgerowConfig(name, user string, natsURLs []string, redisAddr, listen, internal string) string {
	s, p := m.Spec, m.Spec.Ports
	replicas := 1
	if len(p.NATS) >= 3 {
		replicas = 3
	}
	return ProcessConfig{Title: name + " of the local hedgerow cluster, written by hedgerow cluster up",
		User: user, AuthDir: filepath.Join(s.Dir, authDir), NATSURLs: natsURLs, Redis: redisAddr,
		Listen: listen, Internal: internal, Replicas: replicas, FakeLLM: p.FakeLLM}.YAML()
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
