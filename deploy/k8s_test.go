// Package deploy_test checks the Kubernetes manifests of deploy/k8s: every
// overlay renders with kustomize (the library kubectl kustomize embeds, so no
// kubectl is needed), every rendered object decodes strictly into its
// k8s.io/api type, the configuration the ConfigMap carries passes the checks
// `hedgerow config check` runs for each role that reads it, and the NATS
// configuration parses as nats-server parses it, with the users
// `hedgerow nats-auth` generates from that configuration.
package deploy_test

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/natsauth"
)

// overlays are the kustomizations an operator applies.
var overlays = []string{"k8s/overlays/local", "k8s/overlays/production"}

// kinds are the object kinds the manifests may hold, each with its API
// version and the type it decodes into; any other kind fails the test.
var kinds = map[string]struct {
	apiVersion string
	new        func() any
}{
	"Namespace":               {"v1", func() any { return &corev1.Namespace{} }},
	"ServiceAccount":          {"v1", func() any { return &corev1.ServiceAccount{} }},
	"ConfigMap":               {"v1", func() any { return &corev1.ConfigMap{} }},
	"Service":                 {"v1", func() any { return &corev1.Service{} }},
	"Deployment":              {"apps/v1", func() any { return &appsv1.Deployment{} }},
	"StatefulSet":             {"apps/v1", func() any { return &appsv1.StatefulSet{} }},
	"HorizontalPodAutoscaler": {"autoscaling/v2", func() any { return &autoscalingv2.HorizontalPodAutoscaler{} }},
	"PodDisruptionBudget":     {"policy/v1", func() any { return &policyv1.PodDisruptionBudget{} }},
	"NetworkPolicy":           {"networking.k8s.io/v1", func() any { return &networkingv1.NetworkPolicy{} }},
	// The Prometheus Operator's, which the chart renders on request: into
	// the fields of theirs the chart uses (helm_test.go).
	"ServiceMonitor": {"monitoring.coreos.com/v1", func() any { return &serviceMonitor{} }},
	"PodMonitor":     {"monitoring.coreos.com/v1", func() any { return &podMonitor{} }},
	"PrometheusRule": {"monitoring.coreos.com/v1", func() any { return &prometheusRule{} }},
}

// rendered is one overlay's objects, decoded, by kind and name.
type rendered struct {
	overlay string
	objects map[string]map[string]any
}

func (r rendered) get(t *testing.T, kind, name string) any {
	t.Helper()
	o, ok := r.objects[kind][name]
	if !ok {
		t.Fatalf("%s: no %s %s", r.overlay, kind, name)
	}
	return o
}

// render builds the overlay with kustomize and decodes every object strictly.
func render(t *testing.T, overlay string) rendered {
	t.Helper()
	dir, err := filepath.Abs(overlay)
	if err != nil {
		t.Fatal(err)
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize %s: %v", overlay, err)
	}
	out := rendered{overlay: overlay, objects: map[string]map[string]any{}}
	for _, res := range m.Resources() {
		y, err := res.AsYAML()
		if err != nil {
			t.Fatalf("%s: %s: %v", overlay, res.CurId(), err)
		}
		kind, name := res.GetKind(), res.GetName()
		obj, err := decodeStrict(y)
		if err != nil {
			t.Fatalf("%s: %s %s: %v", overlay, kind, name, err)
		}
		if out.objects[kind] == nil {
			out.objects[kind] = map[string]any{}
		}
		if _, dup := out.objects[kind][name]; dup {
			t.Fatalf("%s: two %s named %s", overlay, kind, name)
		}
		out.objects[kind][name] = obj
	}
	return out
}

// decodeStrict decodes one object into the k8s.io/api type of its kind;
// a field that type lacks, a kind not listed or another API version fails.
func decodeStrict(y []byte) (any, error) {
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		return nil, err
	}
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := json.Unmarshal(j, &head); err != nil {
		return nil, err
	}
	k, ok := kinds[head.Kind]
	if !ok {
		return nil, fmt.Errorf("kind %q is not one the manifests may hold", head.Kind)
	}
	if head.APIVersion != k.apiVersion {
		return nil, fmt.Errorf("apiVersion %q, want %q", head.APIVersion, k.apiVersion)
	}
	obj := k.new()
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		return nil, err
	}
	return obj, nil
}

func TestEveryObjectOfEveryOverlayDecodesStrictly(t *testing.T) {
	for _, o := range append([]string{"k8s/base"}, overlays...) {
		t.Run(o, func(t *testing.T) {
			r := render(t, o)
			n := 0
			for _, byName := range r.objects {
				n += len(byName)
			}
			if n == 0 {
				t.Fatal("rendered no object")
			}
		})
	}
}

func TestStrictDecodingRefusesUnknownFieldsAndKinds(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"a misspelt field", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {selectr: {a: b}}\n", "unknown field"},
		{"an unknown kind", "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n", "not one the manifests may hold"},
		{"another API version", "apiVersion: autoscaling/v1\nkind: HorizontalPodAutoscaler\nmetadata: {name: x}\n", "want \"autoscaling/v2\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeStrict([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// roles are the Deployments running hedgerow, the role each runs and the
// generated NATS user whose seed it mounts.
var roles = []struct {
	deployment string
	role       config.Role
	natsUser   string
}{
	{"hedgerow-gateway", config.RoleGateway, natsauth.UserGateway},
	{"hedgerow-worker", config.RoleWorker, natsauth.UserWorker},
}

func TestTheConfigMapPassesConfigCheckForEachRoleThatReadsIt(t *testing.T) {
	bundle := anyUsers(t)
	for _, o := range overlays {
		t.Run(o, func(t *testing.T) {
			r := render(t, o)
			for _, rl := range roles {
				d := r.get(t, "Deployment", rl.deployment).(*appsv1.Deployment)
				spec := d.Spec.Template.Spec
				c := spec.Containers[0]
				file := flagValue(t, c.Args, "--config")
				if c.Args[0] != string(rl.role) {
					t.Fatalf("%s runs %q, want the %s command", rl.deployment, c.Args[0], rl.role)
				}
				cmName, key := mountedConfigMap(t, spec, c, file)
				cm := r.get(t, "ConfigMap", cmName).(*corev1.ConfigMap)
				data, ok := cm.Data[key]
				if !ok {
					t.Fatalf("ConfigMap %s has no %s", cmName, key)
				}
				// The variables the container sets; with a Secret's every
				// key as variables (envFrom), any the file names.
				env := func(name string) (string, bool) {
					if len(c.EnvFrom) > 0 {
						return "set", true
					}
					for _, e := range c.Env {
						if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
							return "set", true
						}
					}
					return "", false
				}
				cfg, root, err := parseInPod(t, r, spec, c, file, data, rl.role, env, bundle)
				var problems config.Problems
				if errors.As(err, &problems) {
					t.Fatalf("%s: config check --role %s:\n%v", rl.deployment, rl.role, err)
				}
				if err != nil {
					t.Fatal(err)
				}
				inPod := func(p string) string { return strings.TrimPrefix(p, root) }
				checkAuthMounted(t, spec, c, inPod(cfg.NATS.NKeySeedFile), rl.natsUser+".nk")
				// TLS with the role's client certificate (nats-auth --tls),
				// and to Redis trusting the same CA.
				checkAuthMounted(t, spec, c, inPod(cfg.NATS.TLS.CAFile), natsauth.CAFile)
				checkAuthMounted(t, spec, c, inPod(cfg.NATS.TLS.CertFile), natsauth.ClientCertFile(rl.natsUser))
				checkAuthMounted(t, spec, c, inPod(cfg.NATS.TLS.KeyFile), natsauth.ClientKeyFile(rl.natsUser))
				checkAuthMounted(t, spec, c, inPod(cfg.Redis.TLS.CAFile), natsauth.CAFile)
				for _, u := range cfg.NATS.URLs {
					if !strings.HasPrefix(u, "tls://") {
						t.Errorf("%s reaches NATS at %s, want tls://", rl.deployment, u)
					}
				}
				if !strings.HasPrefix(cfg.Redis.URL, "rediss://") || !cfg.Redis.TLS.Enabled {
					t.Errorf("%s reaches Redis at %s (TLS %v), want rediss://", rl.deployment, cfg.Redis.URL, cfg.Redis.TLS.Enabled)
				}
				if rl.role == config.RoleGateway && len(c.EnvFrom) > 0 {
					t.Fatalf("the gateway takes variables from %v: it never reads provider keys", c.EnvFrom)
				}
				if rl.role == config.RoleGateway {
					checkReplayBound(t, r, cfg)
				}
			}
		})
	}
}

// checkReplayBound checks that the answers the gateways keep for replay
// in Redis (http.idempotency.max_total_bytes, all of them together) sit
// well under Redis' maxmemory — at most a quarter —, which must hold the
// winner gate, the budgets, the slices and the markers too and past which
// a noeviction Redis refuses the gate's writes (docs/architecture.md §2).
func checkReplayBound(t *testing.T, r rendered, cfg *config.Config) {
	t.Helper()
	sts := r.get(t, "StatefulSet", "hedgerow-redis").(*appsv1.StatefulSet)
	script := strings.Join(sts.Spec.Template.Spec.Containers[0].Command, " ")
	m := regexp.MustCompile(`--maxmemory (\d+)mb\b`).FindStringSubmatch(script)
	if m == nil {
		t.Fatalf("Redis runs without a --maxmemory in mb: %s", script)
	}
	mb, _ := strconv.ParseInt(m[1], 10, 64)
	if bound := int64(cfg.HTTP.Idempotency.MaxTotalBytes); bound <= 0 || bound > mb<<20/4 {
		t.Errorf("http.idempotency.max_total_bytes %d is over a quarter of Redis' maxmemory %d MB", bound, mb)
	}
}

// flagValue is the value after flag in args.
func flagValue(t *testing.T, args []string, flag string) string {
	t.Helper()
	i := slices.Index(args, flag)
	if i < 0 || i+1 >= len(args) {
		t.Fatalf("args %q have no %s", args, flag)
	}
	return args[i+1]
}

// mountedConfigMap is the ConfigMap and key the container sees at file.
func mountedConfigMap(t *testing.T, spec corev1.PodSpec, c corev1.Container, file string) (string, string) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if path.Dir(file) != m.MountPath {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil {
				return v.ConfigMap.Name, path.Base(file)
			}
		}
	}
	t.Fatalf("%s: no ConfigMap is mounted at %s", c.Name, path.Dir(file))
	return "", ""
}

// checkAuthMounted fails unless the container sees a file `hedgerow
// nats-auth` generated (the key seedKey of the Secret hedgerow-nats-auth:
// a user's seed, certificate or key, or the CA) at file.
func checkAuthMounted(t *testing.T, spec corev1.PodSpec, c corev1.Container, file, seedKey string) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if path.Dir(file) != m.MountPath {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name != m.Name || v.Secret == nil || v.Secret.SecretName != "hedgerow-nats-auth" {
				continue
			}
			for _, it := range v.Secret.Items {
				if it.Key == seedKey && it.Path == path.Base(file) {
					return
				}
			}
		}
	}
	t.Fatalf("%s: the Secret hedgerow-nats-auth's %s is not mounted at %s", c.Name, seedKey, file)
}

func TestGatewaysProbeReadyzAndHealthzAndScaleWithinABudget(t *testing.T) {
	for _, o := range overlays {
		t.Run(o, func(t *testing.T) {
			r := render(t, o)
			d := r.get(t, "Deployment", "hedgerow-gateway").(*appsv1.Deployment)
			c := d.Spec.Template.Spec.Containers[0]
			if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
				t.Errorf("readiness probe %+v, want GET /readyz", c.ReadinessProbe)
			}
			if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
				t.Errorf("liveness probe %+v, want GET /healthz", c.LivenessProbe)
			}
			hpa := r.get(t, "HorizontalPodAutoscaler", "hedgerow-gateway").(*autoscalingv2.HorizontalPodAutoscaler)
			if hpa.Spec.ScaleTargetRef.Name != d.Name || hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas < 2 {
				t.Errorf("HPA targets %s from %v replicas, want the gateway from at least 2", hpa.Spec.ScaleTargetRef.Name, hpa.Spec.MinReplicas)
			}
			for _, name := range []string{"hedgerow-gateway", "hedgerow-worker", "hedgerow-nats"} {
				pdb := r.get(t, "PodDisruptionBudget", name).(*policyv1.PodDisruptionBudget)
				if pdb.Spec.MinAvailable == nil && pdb.Spec.MaxUnavailable == nil {
					t.Errorf("PDB %s bounds nothing", name)
				}
			}
			for _, kind := range []string{"Deployment", "StatefulSet"} {
				for name, obj := range r.objects[kind] {
					var ps corev1.PodSpec
					if kind == "Deployment" {
						ps = obj.(*appsv1.Deployment).Spec.Template.Spec
					} else {
						ps = obj.(*appsv1.StatefulSet).Spec.Template.Spec
					}
					if ps.SecurityContext == nil || ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot {
						t.Errorf("%s %s may run as root", kind, name)
					}
				}
			}
		})
	}
}

// TestOnlyGatewaysAndWorkersReachNATSAndRedis reads the NetworkPolicies: a
// deny-all ingress policy covers every hedgerow Pod, and the client ports
// of NATS and Redis are opened to the gateways' and workers' Pods only.
func TestOnlyGatewaysAndWorkersReachNATSAndRedis(t *testing.T) {
	for _, o := range overlays {
		t.Run(o, func(t *testing.T) {
			r := render(t, o)
			deny := r.get(t, "NetworkPolicy", "hedgerow-default-deny-ingress").(*networkingv1.NetworkPolicy)
			if len(deny.Spec.Ingress) != 0 || deny.Spec.PodSelector.MatchLabels["app.kubernetes.io/part-of"] != "hedgerow" {
				t.Fatalf("default deny %+v", deny.Spec)
			}
			for _, tc := range []struct {
				target string
				port   int32
			}{{"hedgerow-nats", 4222}, {"hedgerow-redis", 6379}} {
				var from []string
				for _, obj := range r.objects["NetworkPolicy"] {
					np := obj.(*networkingv1.NetworkPolicy)
					if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != tc.target {
						continue
					}
					for _, rule := range np.Spec.Ingress {
						if !opensPort(rule.Ports, tc.port) {
							continue
						}
						if len(rule.From) == 0 {
							t.Fatalf("%s opens %d to everyone", np.Name, tc.port)
						}
						for _, peer := range rule.From {
							if peer.NamespaceSelector != nil || peer.IPBlock != nil || peer.PodSelector == nil {
								t.Fatalf("%s opens %d beyond the namespace's Pods: %+v", np.Name, tc.port, peer)
							}
							from = append(from, peer.PodSelector.MatchLabels["app.kubernetes.io/name"])
						}
					}
				}
				slices.Sort(from)
				if want := []string{"hedgerow-gateway", "hedgerow-worker"}; !slices.Equal(from, want) {
					t.Errorf("%s:%d is open to %v, want %v", tc.target, tc.port, from, want)
				}
				// The Pods the rules name carry those labels.
				for _, name := range []string{"hedgerow-gateway", "hedgerow-worker"} {
					d := r.get(t, "Deployment", name).(*appsv1.Deployment)
					if d.Spec.Template.Labels["app.kubernetes.io/name"] != name || d.Spec.Template.Labels["app.kubernetes.io/part-of"] != "hedgerow" {
						t.Errorf("%s's Pods are labelled %v", name, d.Spec.Template.Labels)
					}
				}
			}
		})
	}
}

func opensPort(ports []networkingv1.NetworkPolicyPort, port int32) bool {
	for _, p := range ports {
		if p.Port != nil && p.Port.IntVal == port {
			return true
		}
	}
	return false
}

// TestNATSConfigParsesWithTheGeneratedUsers writes the ConfigMap's
// nats.conf and the authorization `hedgerow nats-auth` generates from the
// overlay's hedgerow configuration where the StatefulSet mounts them, and
// parses them as nats-server does at start.
func TestNATSConfigParsesWithTheGeneratedUsers(t *testing.T) {
	for _, o := range overlays {
		t.Run(o, func(t *testing.T) {
			r := render(t, o)
			ss := r.get(t, "StatefulSet", "hedgerow-nats").(*appsv1.StatefulSet)
			if ss.Spec.Replicas == nil || *ss.Spec.Replicas != 3 {
				t.Fatalf("NATS replicas %v, want 3", ss.Spec.Replicas)
			}
			c := ss.Spec.Template.Spec.Containers[0]
			confPath := flagValue(t, c.Args, "--config")
			mountedConfigMap(t, ss.Spec.Template.Spec, c, confPath)
			// The configuration as a gateway reads it, for the users.
			gw := r.get(t, "Deployment", "hedgerow-gateway").(*appsv1.Deployment).Spec.Template.Spec
			hcfg, _, err := parseInPod(t, r, gw, gw.Containers[0], "/etc/hedgerow/hedgerow.yaml",
				r.get(t, "ConfigMap", "hedgerow-config").(*corev1.ConfigMap).Data["hedgerow.yaml"],
				config.RoleGateway, func(string) (string, bool) { return "set", true }, anyUsers(t))
			if err != nil {
				t.Fatal(err)
			}
			bundle := generateUsers(t, hcfg)
			// The container's file system under a temporary root: every
			// volume it mounts, absolute paths in the configuration files
			// moved under the root.
			root := t.TempDir()
			mountVolumes(t, root, r, ss.Spec.Template.Spec, c, secretFiles(bundle))
			setContainerEnv(t, c, map[string]string{"POD_NAME": "hedgerow-nats-0"})
			opts, err := server.ProcessConfigFile(filepath.Join(root, confPath))
			if err != nil {
				t.Fatalf("nats-server refuses %s: %v", confPath, err)
			}
			if opts.TLSConfig == nil || opts.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert ||
				opts.Cluster.TLSConfig == nil || opts.Cluster.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
				t.Errorf("clients over TLS %v, routes over TLS %v; want both, with certificates the CA signed",
					opts.TLSConfig != nil, opts.Cluster.TLSConfig != nil)
			}
			if !opts.JetStream || opts.ServerName != "hedgerow-nats-0" || len(opts.Routes) != 3 || opts.Cluster.Port != 6222 {
				t.Errorf("JetStream %v, name %q, %d routes, cluster port %d; want JetStream, the Pod's name, 3 routes, 6222",
					opts.JetStream, opts.ServerName, len(opts.Routes), opts.Cluster.Port)
			}
			if !opts.SyncAlways {
				t.Errorf("JetStream fsyncs every %v; want sync_interval: always, so the gate's ledger outlives an OS crash", opts.SyncInterval)
			}
			if opts.Cluster.Username != "route" || opts.Cluster.Password != secretValue("route-password") {
				t.Errorf("routes are not authorized: cluster user %q", opts.Cluster.Username)
			}
			for _, r := range opts.Routes {
				if p, _ := r.User.Password(); r.User.Username() != opts.Cluster.Username || p != opts.Cluster.Password {
					t.Errorf("route %s does not present the route user", r.Redacted())
				}
			}
			if opts.SystemAccount != "SYS" {
				t.Errorf("system account %q, want SYS", opts.SystemAccount)
			}
			natsServerAccepts(t, opts)
			volume := ss.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests[corev1.ResourceStorage]
			if opts.JetStreamMaxStore <= 0 || opts.JetStreamMaxStore > volume.Value()*9/10 {
				t.Errorf("max_file_store %d bytes, want at most 90%% of the data volume's %s", opts.JetStreamMaxStore, volume.String())
			}
			if int64(opts.MaxPayload) < int64(hcfg.NATS.MaxPayload) {
				t.Errorf("max_payload %d is below the gateways' nats.max_payload %d", opts.MaxPayload, int64(hcfg.NATS.MaxPayload))
			}
			for _, name := range []string{natsauth.UserGateway, natsauth.UserWorker} {
				u, _ := bundle.User(name)
				if !slices.ContainsFunc(opts.Nkeys, func(n *server.NkeyUser) bool { return n.Nkey == u.Public }) {
					t.Errorf("the server does not know the %s user", name)
				}
			}
		})
	}
}

func write(t *testing.T, name string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestEveryGoProcessHasASoftMemoryLimitUnderItsContainers: every hedgerow
// and NATS container sets GOMEMLIMIT between 75% and 95% of its memory
// limit, so the collector works harder before the kernel kills it.
func TestEveryGoProcessHasASoftMemoryLimitUnderItsContainers(t *testing.T) {
	for _, o := range overlays {
		t.Run(o, func(t *testing.T) {
			checkGoMemLimits(t, render(t, o).objects)
		})
	}
}

// checkGoMemLimits runs the GOMEMLIMIT check on the gateway, worker and
// NATS containers among objects.
func checkGoMemLimits(t *testing.T, objects map[string]map[string]any) {
	t.Helper()
	n := 0
	for _, kind := range []string{"Deployment", "StatefulSet"} {
		for name, obj := range objects[kind] {
			if name != "hedgerow-gateway" && name != "hedgerow-worker" && name != "hedgerow-nats" {
				continue
			}
			var ps corev1.PodSpec
			if d, ok := obj.(*appsv1.Deployment); ok {
				ps = d.Spec.Template.Spec
			} else {
				ps = obj.(*appsv1.StatefulSet).Spec.Template.Spec
			}
			c := ps.Containers[0]
			limit, ok := c.Resources.Limits[corev1.ResourceMemory]
			if !ok {
				t.Errorf("%s has no memory limit", name)
				continue
			}
			i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "GOMEMLIMIT" })
			if i < 0 {
				t.Errorf("%s sets no GOMEMLIMIT", name)
				continue
			}
			soft, err := parseGoMemLimit(c.Env[i].Value)
			if err != nil {
				t.Errorf("%s: GOMEMLIMIT %q: %v", name, c.Env[i].Value, err)
				continue
			}
			if soft < limit.Value()*3/4 || soft > limit.Value()*95/100 {
				t.Errorf("%s: GOMEMLIMIT %s is %d bytes, want 75–95%% of its memory limit %s", name, c.Env[i].Value, soft, limit.String())
			}
			n++
		}
	}
	if n == 0 {
		t.Fatal("no gateway, worker or NATS container")
	}
}

// parseGoMemLimit reads GOMEMLIMIT as the Go runtime does: a number of
// bytes with an optional B, KiB, MiB, GiB or TiB suffix.
func parseGoMemLimit(v string) (int64, error) {
	for _, u := range []struct {
		suffix string
		scale  int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}} {
		if num, ok := strings.CutSuffix(v, u.suffix); ok {
			n, err := strconv.ParseInt(num, 10, 64)
			return n * u.scale, err
		}
	}
	return strconv.ParseInt(v, 10, 64)
}

// TestAutoscaledWorkloadsLeaveTheirReplicasToTheHPA: the gateway and
// worker Deployments set no replicas (an apply would reset the HPA's
// count) and each has an HPA on its load metric from the Prometheus
// adapter (deploy/k8s/README.md, "Scaling").
func TestAutoscaledWorkloadsLeaveTheirReplicasToTheHPA(t *testing.T) {
	for _, o := range overlays {
		t.Run(o, func(t *testing.T) {
			checkAutoscaling(t, render(t, o).objects)
		})
	}
}

// loadMetrics are the adapter metrics each Deployment scales on.
var loadMetrics = map[string]string{
	"hedgerow-gateway": "hedgerow_groups_in_flight",
	"hedgerow-worker":  "hedgerow_worker_busy_ratio",
}

func checkAutoscaling(t *testing.T, objects map[string]map[string]any) {
	t.Helper()
	for name, metric := range loadMetrics {
		d, ok := objects["Deployment"][name].(*appsv1.Deployment)
		if !ok {
			t.Fatalf("no Deployment %s", name)
		}
		if d.Spec.Replicas != nil {
			t.Errorf("Deployment %s sets replicas %d beside its HPA", name, *d.Spec.Replicas)
		}
		hpa, ok := objects["HorizontalPodAutoscaler"][name].(*autoscalingv2.HorizontalPodAutoscaler)
		if !ok {
			t.Errorf("no HPA scales %s", name)
			continue
		}
		if hpa.Spec.ScaleTargetRef.Kind != "Deployment" || hpa.Spec.ScaleTargetRef.Name != name {
			t.Errorf("HPA %s scales %+v", name, hpa.Spec.ScaleTargetRef)
		}
		if !slices.ContainsFunc(hpa.Spec.Metrics, func(m autoscalingv2.MetricSpec) bool {
			return m.Type == autoscalingv2.PodsMetricSourceType && m.Pods != nil && m.Pods.Metric.Name == metric &&
				m.Pods.Target.Type == autoscalingv2.AverageValueMetricType && m.Pods.Target.AverageValue != nil
		}) {
			t.Errorf("HPA %s does not scale on the Pods metric %s: %+v", name, metric, hpa.Spec.Metrics)
		}
	}
}

// TestEgressLeavesOnlyByItsRoles: a default-deny egress policy covers every
// hedgerow Pod and lets it ask DNS only; gateways and workers reach NATS
// and Redis; only workers leave the cluster, on 443.
func TestEgressLeavesOnlyByItsRoles(t *testing.T) {
	for _, o := range overlays {
		t.Run(o, func(t *testing.T) {
			checkEgress(t, render(t, o).objects)
		})
	}
}

func checkEgress(t *testing.T, objects map[string]map[string]any) {
	t.Helper()
	var deny *networkingv1.NetworkPolicy
	egress := map[string][]networkingv1.NetworkPolicyEgressRule{}
	for _, obj := range objects["NetworkPolicy"] {
		np := obj.(*networkingv1.NetworkPolicy)
		if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
			continue
		}
		if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/part-of"] == "hedgerow" {
			deny = np
			continue
		}
		target := np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"]
		egress[target] = append(egress[target], np.Spec.Egress...)
	}
	if deny == nil {
		t.Fatal("no egress policy covers every hedgerow Pod")
	}
	for _, rule := range deny.Spec.Egress {
		for _, p := range rule.Ports {
			if p.Port == nil || p.Port.IntVal != 53 {
				t.Errorf("the default egress policy opens %+v beyond DNS", p)
			}
		}
		if len(rule.Ports) == 0 || len(rule.To) == 0 {
			t.Errorf("the default egress policy has an open rule %+v", rule)
		}
	}
	reaches := func(pod, to string, port int32) bool {
		for _, rule := range egress[pod] {
			if !opensPort(rule.Ports, port) {
				continue
			}
			for _, peer := range rule.To {
				if to == "" && peer.IPBlock != nil && (peer.IPBlock.CIDR == "0.0.0.0/0" || peer.IPBlock.CIDR == "::/0") {
					return true
				}
				if to != "" && peer.PodSelector != nil && peer.PodSelector.MatchLabels["app.kubernetes.io/name"] == to {
					return true
				}
			}
		}
		return false
	}
	for _, tc := range []struct {
		pod, to string
		port    int32
		want    bool
	}{
		{"hedgerow-gateway", "hedgerow-nats", 4222, true},
		{"hedgerow-gateway", "hedgerow-redis", 6379, true},
		{"hedgerow-worker", "hedgerow-nats", 4222, true},
		{"hedgerow-worker", "hedgerow-redis", 6379, true},
		{"hedgerow-worker", "", 443, true},
		{"hedgerow-gateway", "", 443, false},
	} {
		if got := reaches(tc.pod, tc.to, tc.port); got != tc.want {
			t.Errorf("%s reaches %q on %d: %v, want %v", tc.pod, tc.to, tc.port, got, tc.want)
		}
	}
}

// secretValue is the value the tests give a Secret's key: its name.
func secretValue(key string) string { return "secret-" + key }

// setContainerEnv sets the container's variables as the kubelet would:
// literal values with $(VAR) references to those before them expanded,
// a Secret's key as secretValue(key), and fixed for those from fields.
func setContainerEnv(t *testing.T, c corev1.Container, fixed map[string]string) {
	t.Helper()
	vals := map[string]string{}
	for _, e := range c.Env {
		var v string
		switch {
		case e.ValueFrom == nil:
			v = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(e.Value, func(ref string) string {
				name := ref[2 : len(ref)-1]
				if r, ok := vals[name]; ok {
					return r
				}
				return ref
			})
		case e.ValueFrom.SecretKeyRef != nil:
			v = secretValue(e.ValueFrom.SecretKeyRef.Key)
		default:
			var ok bool
			if v, ok = fixed[e.Name]; !ok {
				t.Fatalf("%s: no value for %s", c.Name, e.Name)
			}
		}
		vals[e.Name] = v
		t.Setenv(e.Name, v)
	}
}

// generateUsers is what `hedgerow nats-auth --tls` generates from the
// configuration: the users, their permissions and the TLS material.
func generateUsers(t *testing.T, cfg *config.Config) *natsauth.Bundle {
	t.Helper()
	spec := natsauth.Spec{GateBucket: cfg.Gate.Bucket, RecordsStream: cfg.Records.Stream,
		Responses: natsauth.ResponsesForConfig(cfg), TLS: &natsauth.TLSSpec{ServerNames: []string{"hedgerow-nats"}}}
	for _, rt := range cfg.Routes {
		spec.Routes = append(spec.Routes, rt.Name)
	}
	bundle, err := natsauth.Generate(spec)
	if err != nil {
		t.Fatal(err)
	}
	return bundle
}

// secretFiles are the keys of the Secret hedgerow-nats-auth as the README
// has the operator create it from what `hedgerow nats-auth --tls` wrote:
// the folder's files and its tls folder's.
func secretFiles(b *natsauth.Bundle) map[string][]byte {
	files := map[string][]byte{natsauth.ServerConfigFile: b.ServerConfig()}
	for _, u := range []string{natsauth.UserGateway, natsauth.UserWorker} {
		user, _ := b.User(u)
		files[u+".nk"] = user.Secret
	}
	for name, data := range b.TLS.Files {
		files[name] = data
	}
	return files
}

// mountVolumes writes under root what container c of pod spec sees: every
// ConfigMap (from the rendered r) and the Secret hedgerow-nats-auth (its
// keys secret) it mounts, plain or projected, with their items. In the
// .conf files written, every mount path is moved under root, so absolute
// paths resolve there. Claims and emptyDirs are left empty.
func mountVolumes(t *testing.T, root string, r rendered, spec corev1.PodSpec, c corev1.Container, secret map[string][]byte) {
	t.Helper()
	var mountPaths []string
	for _, m := range c.VolumeMounts {
		mountPaths = append(mountPaths, m.MountPath)
	}
	put := func(dir, key, path string, data []byte) {
		if strings.HasSuffix(path, ".conf") {
			for _, mp := range mountPaths {
				data = bytes.ReplaceAll(data, []byte(`"`+mp+"/"), []byte(`"`+filepath.Join(root, mp)+"/"))
			}
		}
		write(t, filepath.Join(root, dir, path), data)
	}
	configMap := func(dir, name string, items []corev1.KeyToPath) {
		cm := r.get(t, "ConfigMap", name).(*corev1.ConfigMap)
		if len(items) == 0 {
			for k, v := range cm.Data {
				put(dir, k, k, []byte(v))
			}
		}
		for _, it := range items {
			v, ok := cm.Data[it.Key]
			if !ok {
				t.Fatalf("ConfigMap %s has no %s", name, it.Key)
			}
			put(dir, it.Key, it.Path, []byte(v))
		}
	}
	secretItems := func(dir, name string, items []corev1.KeyToPath) {
		if name != "hedgerow-nats-auth" || len(items) == 0 {
			t.Fatalf("%s mounts the Secret %s with items %v; the test knows hedgerow-nats-auth's items", c.Name, name, items)
		}
		for _, it := range items {
			v, ok := secret[it.Key]
			if !ok {
				t.Fatalf("%s mounts %s, a key `hedgerow nats-auth --tls` does not write", c.Name, it.Key)
			}
			put(dir, it.Key, it.Path, v)
		}
	}
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 {
			continue // a volume claim template's: empty at start
		}
		v := spec.Volumes[i]
		switch {
		case v.ConfigMap != nil:
			configMap(m.MountPath, v.ConfigMap.Name, v.ConfigMap.Items)
		case v.Secret != nil:
			secretItems(m.MountPath, v.Secret.SecretName, v.Secret.Items)
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				switch {
				case src.ConfigMap != nil:
					configMap(m.MountPath, src.ConfigMap.Name, src.ConfigMap.Items)
				case src.Secret != nil:
					secretItems(m.MountPath, src.Secret.Name, src.Secret.Items)
				}
			}
		}
	}
}

// parseInPod runs config check (config.Parse) on data, the configuration
// container c of spec reads at file, with the files the container mounts
// written under a temporary root (the Secret hedgerow-nats-auth's from
// bundle) and the configuration's absolute paths moved there, so the
// check finds what the Pod mounts. It returns the root too: paths in the
// result start with it.
func parseInPod(t *testing.T, r rendered, spec corev1.PodSpec, c corev1.Container, file, data string, role config.Role,
	env func(string) (string, bool), bundle *natsauth.Bundle) (*config.Config, string, error) {
	t.Helper()
	root := t.TempDir()
	mountVolumes(t, root, r, spec, c, secretFiles(bundle))
	for _, m := range c.VolumeMounts {
		data = strings.ReplaceAll(data, " "+m.MountPath+"/", " "+filepath.Join(root, m.MountPath)+"/")
	}
	cfg, err := config.Parse(filepath.Join(root, file), []byte(data), role, env)
	return cfg, root, err
}

// anyUsers is what `hedgerow nats-auth --tls` writes for any
// configuration: files where the Secret hedgerow-nats-auth's keys go.
func anyUsers(t *testing.T) *natsauth.Bundle {
	t.Helper()
	bundle, err := natsauth.Generate(natsauth.Spec{GateBucket: "gate", RecordsStream: "records", Routes: []string{"route"},
		Responses: natsauth.ResponsesFor(30*time.Second, 5*time.Second),
		TLS:       &natsauth.TLSSpec{ServerNames: []string{"hedgerow-nats"}}})
	if err != nil {
		t.Fatal(err)
	}
	return bundle
}
