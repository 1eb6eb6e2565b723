package regions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/natsauth"
	"github.com/hedgerow/hedgerow/internal/tools/cluster"
	"github.com/hedgerow/hedgerow/internal/tools/faultproxy"
)

// ManifestFile is the manifest's name in the state directory.
const ManifestFile = "regions.json"

// Manifest is what Up started, in start order, and the spec it ran.
type Manifest struct {
	Spec Spec `json:"spec"`
	cluster.Procs
}

// ReadManifest reads dir's manifest.
func ReadManifest(dir string) (*Manifest, error) {
	var m Manifest
	if err := cluster.ReadManifestFile(dir, ManifestFile, &m); err != nil {
		return nil, err
	}
	m.Dir, m.File = m.Spec.Dir, ManifestFile
	return &m, nil
}

// IsUp reports whether dir's regions are up: a manifest whose parts all run.
func IsUp(dir string) bool { return cluster.ProcsUp(dir, ManifestFile) }

// Down stops every part of dir's regions, the last started first, and
// checks their ports are free. Regions that are not up are no error.
func Down(dir string, out io.Writer) error { return cluster.DownProcs(dir, ManifestFile, out) }

// Status prints each part and whether it runs, and the link's state; an
// error unless every part runs.
func Status(ctx context.Context, dir string, out io.Writer) error {
	if _, err := os.Stat(filepath.Join(dir, ManifestFile)); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("regions: none started in %s (make regions)", dir)
	}
	err := cluster.Status(dir, ManifestFile, out)
	if m, merr := ReadManifest(dir); merr == nil {
		if state, lerr := m.LinkState(ctx); lerr == nil {
			fmt.Fprintln(out, "link:", state)
		}
	}
	return err
}

// GatewayURL is a region's gateway (its API, /readyz and /metrics).
func (m *Manifest) GatewayURL(region string) string {
	return "http://" + cluster.Addr(m.Spec.Ports.HTTP[index(region)])
}

func index(region string) int {
	for i, n := range Names {
		if n == region {
			return i
		}
	}
	panic("regions: no region " + region)
}

// Up writes dir's configurations and credentials (kept from an earlier
// run) and starts every part, returning once each is ready and the
// regions are linked, or at the first failure, having then stopped what
// it started. Regions already up in dir are an error.
func Up(ctx context.Context, s Spec, out io.Writer) (err error) {
	if err := s.validate(); err != nil {
		return err
	}
	if IsUp(s.Dir) {
		return fmt.Errorf("regions: already up in %s (make regions-down first)", s.Dir)
	}
	if _, err := os.Stat(filepath.Join(s.Dir, ManifestFile)); err == nil {
		// Regions partly down: stop what is left before starting anew.
		if err := Down(s.Dir, out); err != nil {
			return err
		}
	}
	for _, b := range []struct {
		path       *string
		name, hint string
	}{{&s.Hedgerow, "hedgerow", "make build"}, {&s.NATSServer, "nats-server", "make nats-server"}, {&s.RedisServer, "redis-server", "make redis"}} {
		if _, err := os.Stat(*b.path); err != nil {
			return fmt.Errorf("regions: the %s binary: %w (%s provides it)", b.name, err, b.hint)
		}
		if *b.path, err = filepath.Abs(*b.path); err != nil {
			return fmt.Errorf("regions: %w", err)
		}
	}
	if err := os.MkdirAll(filepath.Join(s.Dir, "logs"), 0o700); err != nil {
		return fmt.Errorf("regions: %w", err)
	}
	if s.Dir, err = filepath.Abs(s.Dir); err != nil {
		return fmt.Errorf("regions: %w", err)
	}
	if err := cluster.PortsFree(s.Ports.all()); err != nil {
		return fmt.Errorf("regions: %w (other regions, or something else, hold them)", err)
	}
	m := &Manifest{Spec: s, Procs: cluster.Procs{Dir: s.Dir, File: ManifestFile}}
	if err := m.plan(); err != nil {
		return err
	}
	if err := cluster.WriteManifest(s.Dir, ManifestFile, m); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = m.Down(io.Discard)
		}
	}()
	var first, workers []string
	for _, r := range Names {
		first = append(first, RedisName(r), LinkName(r), natsName(r))
		workers = append(workers, WorkerName(r))
	}
	for _, p := range m.Parts {
		if strings.HasPrefix(p.Name, "fakellm-") {
			first = append(first, p.Name)
		}
	}
	if err := m.StartAll(ctx, first, out); err != nil {
		return err
	}
	// The gateways need JetStream's meta layer, which spans both regions:
	// the link up and a meta leader both servers follow.
	lctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	err = m.waitLinked(lctx)
	cancel()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%-18s linked through the proxies (%v each way)\n", "supercluster", s.Delay)
	// The gateways one after the other, east's first: the first renewal
	// creates the leases' bucket in east.
	stages := [][]string{workers}
	for _, r := range Names {
		stages = append(stages, []string{GatewayName(r)})
	}
	for _, stage := range stages {
		if err := m.StartAll(ctx, stage, out); err != nil {
			return err
		}
	}
	return nil
}

// plan writes each region's credentials and every part's configuration
// and fills the manifest, in start order.
func (m *Manifest) plan() error {
	s, p := m.Spec, m.Spec.Ports
	if err := cluster.WriteHashKey(s.Dir); err != nil {
		return err
	}
	write := func(name, data string) (string, error) {
		path := filepath.Join(s.Dir, name)
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			return "", fmt.Errorf("regions: %w", err)
		}
		return path, nil
	}
	m.Parts = append(m.Parts, cluster.FakeLLMParts(s.Hedgerow, p.FakeLLM, s.TimeScale)...)
	for i, r := range Names {
		auth := authDir(s.Dir, r)
		natsURL := "tls://" + cluster.Addr(p.NATS[i])
		cfg := func(user, listen string) cluster.ProcessConfig {
			return cluster.ProcessConfig{Title: fmt.Sprintf("%s's %s of the local hedgerow regions, written by hedgerow regions up", r, user),
				User: user, AuthDir: auth, NATSURLs: []string{natsURL}, Redis: cluster.Addr(p.Redis[i]), Listen: listen,
				Replicas: 1, FakeLLM: p.FakeLLM, Extra: m.regionYAML(r),
				RouteLimits: fmt.Sprintf("{requests_per_minute: %d}", RouteRequestsPerMinute),
				Tenant:      fmt.Sprintf("spend_limit: %d, requests_per_second: %d", SpendLimit, TenantRate)}
		}
		gwConf, err := write(GatewayName(r)+".yaml", cfg(natsauth.UserGateway, cluster.Addr(p.HTTP[i])).YAML())
		if err != nil {
			return err
		}
		wkConf, err := write(WorkerName(r)+".yaml", cfg(natsauth.UserWorker, "127.0.0.1:0").YAML())
		if err != nil {
			return err
		}
		if err := m.writeCredentials(i, gwConf); err != nil {
			return err
		}
		redis, err := cluster.RedisPart(RedisName(r), s.RedisServer, p.Redis[i], filepath.Join(s.Dir, "redis", r))
		if err != nil {
			return err
		}
		node := cluster.NATSNode{Title: r + "'s nats-server of the local hedgerow regions, written by hedgerow regions up",
			Name: natsName(r), Listen: cluster.Addr(p.NATS[i]), Monitor: cluster.Addr(p.NATSMonitor[i]),
			StoreDir: filepath.Join(s.Dir, "jetstream", r), AuthDir: auth,
			// A region is a cluster of one: clustered JetStream, which the
			// gateway makes it, needs a route, so it routes to itself.
			Cluster: r, RouteListen: cluster.Addr(p.NATSRoute[i]), Routes: []string{"tls://" + cluster.Addr(p.NATSRoute[i])},
			Includes: []string{filepath.Join(auth, natsauth.GatewayConfigFile)}}
		conf, err := node.Config(s.Dir)
		if err != nil {
			return err
		}
		natsConf, err := write(natsName(r)+".conf", conf)
		if err != nil {
			return err
		}
		m.Parts = append(m.Parts, redis,
			cluster.ProxyPart(LinkName(r), s.Hedgerow, p.LinkProxy[i], cluster.Addr(p.Link[i]), p.LinkControl[i], s.Delay),
			node.Part(s.NATSServer, natsConf, p.NATS[i], p.NATSRoute[i], p.NATSMonitor[i], p.Link[i]),
			cluster.WorkerPart(WorkerName(r), s.Hedgerow, wkConf, p.WorkerMetrics[i]),
			cluster.GatewayPart(GatewayName(r), s.Hedgerow, gwConf, "http://"+cluster.Addr(p.HTTP[i])+"/readyz", p.HTTP[i]))
	}
	return nil
}

// regionYAML is the region's deployment and the global ceilings.
func (m *Manifest) regionYAML(region string) string {
	return fmt.Sprintf(`deployment: {region: %s}
global:
  regions: [%s]
  ceilings: [%s]
  authority: {placement: %s}
`, region, strings.Join(Names, ", "), strings.Join(GlobalCeilings, ", "), Names[0])
}

// writeCredentials generates region i's users (those its gateway's
// configuration, gwConf, needs), TLS and gateway links, once: regions
// brought up again keep them. The first region's CA and link password
// serve every region (natsauth --from), so their links verify.
func (m *Manifest) writeCredentials(i int, gwConf string) error {
	s, p := m.Spec, m.Spec.Ports
	region := Names[i]
	auth := authDir(s.Dir, region)
	if _, err := os.Stat(filepath.Join(auth, natsauth.ServerConfigFile)); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("regions: %w", err)
	}
	cfg, err := config.LoadForNATSUsers(gwConf)
	if err != nil {
		return fmt.Errorf("regions: %s: %w", gwConf, err)
	}
	spec := natsauth.SpecForConfig(cfg)
	spec.TLS = &natsauth.TLSSpec{}
	// The others dial this region's proxy, which it advertises.
	g := &natsauth.GatewaySpec{Listen: cluster.Addr(p.Link[i]), Advertise: cluster.Addr(p.LinkProxy[i])}
	for j, other := range Names {
		if j != i {
			g.Remotes = append(g.Remotes, natsauth.GatewayRemote{Name: other, URLs: []string{cluster.Addr(p.LinkProxy[j])}})
		}
	}
	if i > 0 {
		first := authDir(s.Dir, Names[0])
		if spec.TLS.CA, err = natsauth.ReadCA(first); err != nil {
			return err
		}
		if g.Password, err = natsauth.ReadGatewayPassword(first); err != nil {
			return err
		}
	}
	spec.Gateway = g
	b, err := natsauth.Generate(spec)
	if err != nil {
		return err
	}
	return b.Write(auth)
}

// waitLinked waits until each region's server has its outbound link to
// every other region and follows a JetStream meta leader.
func (m *Manifest) waitLinked(ctx context.Context) error {
	var last error
	for {
		if last = m.linked(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("regions: the supercluster did not form: %w", last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// linked checks the link and the meta leader once, on the servers'
// monitoring endpoints.
func (m *Manifest) linked(ctx context.Context) error {
	for i, r := range Names {
		base := "http://" + cluster.Addr(m.Spec.Ports.NATSMonitor[i])
		var gz struct {
			Outbound map[string]json.RawMessage `json:"outbound_gateways"`
		}
		if err := cluster.GetJSON(ctx, base+"/gatewayz", &gz); err != nil {
			return err
		}
		if len(gz.Outbound) != len(Names)-1 {
			return fmt.Errorf("%s has %d outbound links, want %d", r, len(gz.Outbound), len(Names)-1)
		}
		var jz struct {
			Meta struct {
				Leader string `json:"leader"`
			} `json:"meta_cluster"`
		}
		if err := cluster.GetJSON(ctx, base+"/jsz", &jz); err != nil {
			return err
		}
		if jz.Meta.Leader == "" {
			return fmt.Errorf("%s follows no JetStream meta leader", r)
		}
	}
	return nil
}

// Link changes the link between the regions: its delay each way (when
// delay is not negative), then cut (true) or heal (false) when cut is
// set. Both proxies change, so the link changes both ways.
func (m *Manifest) Link(ctx context.Context, delay time.Duration, cut *bool) error {
	for _, port := range m.Spec.Ports.LinkControl {
		base := "http://" + cluster.Addr(port)
		if delay >= 0 {
			if err := faultproxy.ControlDelay(ctx, base, delay); err != nil {
				return fmt.Errorf("regions: link: %w", err)
			}
		}
		if cut != nil {
			if err := faultproxy.Control(ctx, base, *cut); err != nil {
				return fmt.Errorf("regions: link: %w", err)
			}
		}
	}
	return nil
}

// LinkState is the link's state as both proxies report it, e.g. "healed,
// 80ms each way".
func (m *Manifest) LinkState(ctx context.Context) (string, error) {
	var states []string
	for i, port := range m.Spec.Ports.LinkControl {
		base := "http://" + cluster.Addr(port)
		state, err := faultproxy.State(ctx, base)
		if err != nil {
			return "", fmt.Errorf("regions: link: %w", err)
		}
		states = append(states, fmt.Sprintf("to %s %s", Names[i], state))
	}
	return strings.Join(states, "; "), nil
}
