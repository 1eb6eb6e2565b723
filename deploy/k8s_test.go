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
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

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
				cfg, err := config.Parse(file, []byte(data), rl.role, env)
				var problems config.Problems
				if errors.As(err, &problems) {
					t.Fatalf("%s: config check --role %s:\n%v", rl.deployment, rl.role, err)
				}
				if err != nil {
					t.Fatal(err)
				}
				checkSeedMounted(t, spec, c, cfg.NATS.NKeySeedFile, rl.natsUser+".nk")
				if rl.role == config.RoleGateway && len(c.EnvFrom) > 0 {
					t.Fatalf("the gateway takes variables from %v: it never reads provider keys", c.EnvFrom)
				}
			}
		})
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

// checkSeedMounted fails unless the container sees the generated user's
// seed (the key seedKey of the Secret hedgerow-nats-auth) at file.
func checkSeedMounted(t *testing.T, spec corev1.PodSpec, c corev1.Container, file, seedKey string) {
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
			cmName, key := mountedConfigMap(t, ss.Spec.Template.Spec, c, confPath)
			conf := r.get(t, "ConfigMap", cmName).(*corev1.ConfigMap).Data[key]
			hcfg, err := config.Parse("hedgerow.yaml",
				[]byte(r.get(t, "ConfigMap", "hedgerow-config").(*corev1.ConfigMap).Data["hedgerow.yaml"]),
				config.RoleGateway, func(string) (string, bool) { return "set", true })
			if err != nil {
				t.Fatal(err)
			}
			spec := natsauth.Spec{GateBucket: hcfg.Gate.Bucket, RecordsStream: hcfg.Records.Stream,
				Responses: natsauth.ResponsesForConfig(hcfg)}
			for _, rt := range hcfg.Routes {
				spec.Routes = append(spec.Routes, rt.Name)
			}
			bundle, err := natsauth.Generate(spec)
			if err != nil {
				t.Fatal(err)
			}
			// The container's file system: the ConfigMap and the Secret at
			// their mount paths, under a temporary root.
			root := t.TempDir()
			authDir := ""
			for _, m := range c.VolumeMounts {
				for _, v := range ss.Spec.Template.Spec.Volumes {
					if v.Name == m.Name && v.Secret != nil && v.Secret.SecretName == "hedgerow-nats-auth" {
						authDir = m.MountPath
					}
				}
			}
			if authDir == "" {
				t.Fatal("the Secret hedgerow-nats-auth is not mounted")
			}
			write(t, filepath.Join(root, confPath), []byte(conf))
			write(t, filepath.Join(root, authDir, natsauth.ServerConfigFile), bundle.ServerConfig())
			t.Setenv("POD_NAME", "hedgerow-nats-0")
			opts, err := server.ProcessConfigFile(filepath.Join(root, confPath))
			if err != nil {
				t.Fatalf("nats-server refuses %s: %v", confPath, err)
			}
			if !opts.JetStream || opts.ServerName != "hedgerow-nats-0" || len(opts.Routes) != 3 || opts.Cluster.Port != 6222 {
				t.Errorf("JetStream %v, name %q, %d routes, cluster port %d; want JetStream, the Pod's name, 3 routes, 6222",
					opts.JetStream, opts.ServerName, len(opts.Routes), opts.Cluster.Port)
			}
			if !opts.SyncAlways {
				t.Errorf("JetStream fsyncs every %v; want sync_interval: always, so the gate's ledger outlives an OS crash", opts.SyncInterval)
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
