package deploy_test

import (
	"errors"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"go.yaml.in/yaml/v3"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/natsauth"
)

// composeService is the part of a compose service the checks read.
type composeService struct {
	Image       string `yaml:"image"`
	User        string `yaml:"user"`
	Healthcheck struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
	Command     []string          `yaml:"command"`
	Ports       []string          `yaml:"ports"`
	Volumes     []string          `yaml:"volumes"`
	Environment map[string]string `yaml:"environment"`
}

// loadCompose reads deploy/compose.yaml, anchors and merge keys resolved.
func loadCompose(t *testing.T) map[string]composeService {
	t.Helper()
	data, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Services map[string]composeService `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	return f.Services
}

// mountSource is the file (relative to deploy/) a service mounts at target.
func mountSource(t *testing.T, s composeService, target string) string {
	t.Helper()
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[1] == target && strings.HasPrefix(parts[0], "./") {
			return strings.TrimPrefix(parts[0], "./")
		}
	}
	t.Fatalf("nothing is mounted at %s (volumes %q)", target, s.Volumes)
	return ""
}

// The compose stack has the topology of `make cluster` on its host ports:
// NATS 4223–4225, Redis 6380, gateways 8081 and 8082, Prometheus 9090.
func TestComposeRunsTheClusterTopologyOnItsPorts(t *testing.T) {
	svcs := loadCompose(t)
	for name, port := range map[string]string{
		"nats-1": "4223:4222", "nats-2": "4224:4222", "nats-3": "4225:4222", "redis": "6380:6379",
		"gateway-1": "8081:8080", "gateway-2": "8082:8080", "prometheus": "9090:9090", "grafana": "3000:3000",
	} {
		s, ok := svcs[name]
		if !ok {
			t.Errorf("no service %s", name)
			continue
		}
		if !slices.Contains(s.Ports, port) {
			t.Errorf("%s publishes %q, want %s", name, s.Ports, port)
		}
	}
	for _, name := range []string{"worker-1", "worker-2", "fakellm-a", "fakellm-b", "fakellm-c"} {
		if s, ok := svcs[name]; !ok || s.Image != hedgerowImage {
			t.Errorf("service %s: %+v, want one running the image %s", name, s, hedgerowImage)
		}
	}
}

// The images, by variable so locally built ones can stand in.
const (
	hedgerowImage = "${HEDGEROW_IMAGE:-hedgerow:dev}"
	hedgerowUser  = "${HEDGEROW_UID:-65532}:${HEDGEROW_GID:-65532}"
	natsUser      = "${NATS_UID:-65533}:${NATS_GID:-65533}"
)

// composeDefault is v as compose interpolates it with no variable set but
// the required ones: "${VAR:-default}" is default, "${VAR:?message}" and
// "${VAR}" are secretValue(VAR).
func composeDefault(v string) string {
	return regexp.MustCompile(`\$\{([A-Z_]+)(?::([-?])([^}]*))?\}`).ReplaceAllStringFunc(v, func(ref string) string {
		m := regexp.MustCompile(`^\$\{([A-Z_]+)(?::([-?])([^}]*))?\}$`).FindStringSubmatch(ref)
		if m[2] == "-" {
			return m[3]
		}
		return secretValue(m[1])
	})
}

// Every hedgerow service runs as the image's user unless HEDGEROW_UID says
// otherwise, with a read-only root and a health check of hedgerow's own
// (the image has no shell); NATS as a user of its own, never root, its
// store in a directory of deploy/compose/state; Redis as its image's redis
// user; NATS, Redis and hedgerow images are named by variables.
func TestComposeRunsNonRootWithImagesByVariable(t *testing.T) {
	svcs := loadCompose(t)
	for name, s := range svcs {
		switch {
		case s.Image == hedgerowImage:
			if s.User != hedgerowUser {
				t.Errorf("%s runs as %q, want %s", name, s.User, hedgerowUser)
			}
			if len(s.Healthcheck.Test) < 3 || s.Healthcheck.Test[0] != "CMD" || s.Healthcheck.Test[1] != "/hedgerow" || s.Healthcheck.Test[2] != "healthcheck" {
				t.Errorf("%s's health check %q, want hedgerow healthcheck", name, s.Healthcheck.Test)
			}
		case strings.HasPrefix(name, "nats-"):
			if !strings.HasPrefix(s.Image, "${NATS_IMAGE:-") {
				t.Errorf("%s's image %q is not named by NATS_IMAGE", name, s.Image)
			}
			if s.User != natsUser {
				t.Errorf("%s runs as %q, want %s", name, s.User, natsUser)
			}
			// Its store in a directory the operator gave that user: a
			// named volume would be root's.
			if src := mountSource(t, s, "/data"); src != "compose/state/"+name {
				t.Errorf("%s keeps its store in %s, want compose/state/%s", name, src, name)
			}
		case name == "redis":
			if !strings.HasPrefix(s.Image, "${REDIS_IMAGE:-") || s.User != "999:999" {
				t.Errorf("redis runs %q as %q, want REDIS_IMAGE as its redis user 999:999", s.Image, s.User)
			}
		}
	}
}

// Every file the stack mounts is in the repository, but for the NATS users
// the operator generates (compose/nats-auth) and the alert rules and
// dashboard of deploy/prometheus and deploy/grafana, mounted where
// Prometheus' rule_files and Grafana's dashboard provider look.
func TestComposeMountsItsFilesWhereTheirReadersLook(t *testing.T) {
	svcs := loadCompose(t)
	generated := map[string]bool{natsauth.ServerConfigFile: true, natsauth.UserGateway + ".nk": true, natsauth.UserWorker + ".nk": true}
	for name, s := range svcs {
		for _, v := range s.Volumes {
			src := strings.Split(v, ":")[0]
			if !strings.HasPrefix(src, "./") {
				continue
			}
			src = strings.TrimPrefix(src, "./")
			switch {
			case path.Dir(src) == "compose/nats-auth":
				if !generated[path.Base(src)] {
					t.Errorf("%s mounts %s, which `hedgerow nats-auth` does not write", name, src)
				}
			case src == "prometheus/alerts.yaml", src == "grafana/hedgerow.json":
			case path.Dir(src) == "compose/state":
				// A NATS store the operator makes (compose.yaml's steps).
			default:
				if _, err := os.Stat(src); err != nil {
					t.Errorf("%s mounts %s: %v", name, src, err)
				}
			}
		}
	}
	rules := mountSource(t, svcs["prometheus"], "/etc/prometheus/alerts.yaml")
	promCfg := mountSource(t, svcs["prometheus"], "/etc/prometheus/prometheus.yml")
	var prom struct {
		RuleFiles []string `yaml:"rule_files"`
	}
	readYAML(t, promCfg, &prom)
	if rules != "prometheus/alerts.yaml" || !slices.Equal(prom.RuleFiles, []string{"/etc/prometheus/alerts.yaml"}) {
		t.Errorf("Prometheus loads %q and mounts %s there, want deploy/prometheus/alerts.yaml", prom.RuleFiles, rules)
	}
	var dash struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, mountSource(t, svcs["grafana"], "/etc/grafana/provisioning/dashboards/hedgerow.yaml"), &dash)
	if len(dash.Providers) != 1 || mountSource(t, svcs["grafana"], dash.Providers[0].Options.Path+"/hedgerow.json") != "grafana/hedgerow.json" {
		t.Errorf("Grafana's dashboard provider %+v does not hold deploy/grafana/hedgerow.json", dash.Providers)
	}
}

func readYAML(t *testing.T, name string, v any) {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// The gateways' and workers' configuration passes `hedgerow config check`
// for their roles, with the variables compose sets, and names the seed
// each service mounts; the NATS services' configuration parses as
// nats-server parses it, with users generated from that configuration.
func TestComposeConfigurationPassesConfigCheckAndNATSParsesItsConfig(t *testing.T) {
	svcs := loadCompose(t)
	var hcfg *config.Config
	for name, want := range map[string]struct {
		role config.Role
		user string
	}{"gateway-1": {config.RoleGateway, natsauth.UserGateway}, "gateway-2": {config.RoleGateway, natsauth.UserGateway},
		"worker-1": {config.RoleWorker, natsauth.UserWorker}, "worker-2": {config.RoleWorker, natsauth.UserWorker}} {
		s := svcs[name]
		if len(s.Command) == 0 || s.Command[0] != string(want.role) {
			t.Fatalf("%s runs %q, want the %s command", name, s.Command, want.role)
		}
		file := mountSource(t, s, flagValue(t, s.Command, "--config"))
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		env := func(v string) (string, bool) {
			_, ok := s.Environment[v]
			return "set", ok
		}
		cfg, err := config.Parse(file, data, want.role, env)
		var problems config.Problems
		if errors.As(err, &problems) {
			t.Fatalf("%s: config check --role %s:\n%v", name, want.role, err)
		}
		if err != nil {
			t.Fatal(err)
		}
		if seed := mountSource(t, s, cfg.NATS.NKeySeedFile); seed != "compose/nats-auth/"+want.user+".nk" {
			t.Errorf("%s mounts %s as its NATS seed, want the %s user's", name, seed, want.user)
		}
		hcfg = cfg
	}
	spec := natsauth.Spec{GateBucket: hcfg.Gate.Bucket, RecordsStream: hcfg.Records.Stream, Responses: natsauth.ResponsesForConfig(hcfg)}
	for _, r := range hcfg.Routes {
		spec.Routes = append(spec.Routes, r.Name)
	}
	bundle, err := natsauth.Generate(spec)
	if err != nil {
		t.Fatal(err)
	}
	s := svcs["nats-1"]
	confTarget := flagValue(t, s.Command, "--config")
	authTarget := "/etc/nats/auth/" + natsauth.ServerConfigFile
	if got := mountSource(t, s, authTarget); got != "compose/nats-auth/"+natsauth.ServerConfigFile {
		t.Fatalf("nats-1 mounts %s at %s", got, authTarget)
	}
	conf, err := os.ReadFile(mountSource(t, s, confTarget))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	write(t, filepath.Join(root, confTarget), conf)
	write(t, filepath.Join(root, authTarget), bundle.ServerConfig())
	for k, v := range s.Environment {
		t.Setenv(k, composeDefault(v))
	}
	opts, err := server.ProcessConfigFile(filepath.Join(root, confTarget))
	if err != nil {
		t.Fatalf("nats-server refuses the compose configuration: %v", err)
	}
	if !opts.JetStream || opts.ServerName != "nats-1" || len(opts.Routes) != 3 || int64(opts.MaxPayload) < int64(hcfg.NATS.MaxPayload) {
		t.Errorf("JetStream %v, name %q, %d routes, max_payload %d; want JetStream, nats-1, 3 routes, at least %d",
			opts.JetStream, opts.ServerName, len(opts.Routes), opts.MaxPayload, int64(hcfg.NATS.MaxPayload))
	}
	if !opts.SyncAlways {
		t.Errorf("JetStream fsyncs every %v; want sync_interval: always, so the gate's ledger outlives an OS crash", opts.SyncInterval)
	}
	if opts.Cluster.Username != "route" || opts.Cluster.Password != secretValue("HEDGEROW_NATS_ROUTE_PASSWORD") {
		t.Errorf("routes are not authorized: cluster user %q", opts.Cluster.Username)
	}
	for _, r := range opts.Routes {
		if p, _ := r.User.Password(); r.User.Username() != opts.Cluster.Username || p != opts.Cluster.Password {
			t.Errorf("route %s does not present the route user", r.Redacted())
		}
	}
	natsServerAccepts(t, opts)
}

// natsServerAccepts fails t unless nats-server takes opts whole, as at
// its start (accounts beside the generated users, the system account).
func natsServerAccepts(t *testing.T, opts *server.Options) {
	t.Helper()
	check := *opts
	check.NoSigs, check.NoLog = true, true
	if s, err := server.NewServer(&check); err != nil {
		t.Errorf("nats-server refuses the options: %v", err)
	} else {
		s.Shutdown()
	}
}
