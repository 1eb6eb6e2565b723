package deploy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// The chart and the values file of the production overlay's topology.
const (
	chartDir         = "helm/hedgerow"
	productionValues = "helm/values-production.yaml"
)

// renderChart renders the chart as `helm template hedgerow -n namespace -f
// valuesFile` does — Helm's own chart loader and template engine, no
// cluster — with extra values set over the file's, and decodes every
// object strictly, as render does the overlays.
func renderChart(t *testing.T, valuesFile, namespace string, extra map[string]any) rendered {
	t.Helper()
	files, err := renderChartFiles(valuesFile, namespace, extra)
	if err != nil {
		t.Fatal(err)
	}
	out := rendered{overlay: chartDir + " with " + valuesFile, objects: map[string]map[string]any{}}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range files {
			if !yield(n) {
				return
			}
		}
	})
	for _, file := range names {
		if !strings.HasSuffix(file, ".yaml") {
			continue
		}
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(files[file], -1) {
			if isEmptyYAML(doc) {
				continue
			}
			obj, err := decodeStrict([]byte(doc))
			if err != nil {
				t.Fatalf("%s: %v\n%s", file, err, doc)
			}
			var head struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name      string `json:"name"`
					Namespace string `json:"namespace"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				t.Fatal(err)
			}
			if head.Metadata.Namespace != namespace {
				t.Errorf("%s %s is in namespace %q, want the release's %q", head.Kind, head.Metadata.Name, head.Metadata.Namespace, namespace)
			}
			if out.objects[head.Kind] == nil {
				out.objects[head.Kind] = map[string]any{}
			}
			if _, dup := out.objects[head.Kind][head.Metadata.Name]; dup {
				t.Fatalf("two %s named %s", head.Kind, head.Metadata.Name)
			}
			out.objects[head.Kind][head.Metadata.Name] = obj
		}
	}
	return out
}

// renderChartFiles is the chart's rendered templates by file name.
func renderChartFiles(valuesFile, namespace string, extra map[string]any) (map[string]string, error) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", chartDir, err)
	}
	vals := map[string]any{}
	if valuesFile != "" {
		data, err := os.ReadFile(valuesFile)
		if err != nil {
			return nil, err
		}
		if vals, err = loader.LoadValues(bytes.NewReader(data)); err != nil {
			return nil, fmt.Errorf("%s: %w", valuesFile, err)
		}
	}
	for k, v := range extra {
		vals[k] = v
	}
	top, err := util.ToRenderValues(chrt, vals, common.ReleaseOptions{Name: "hedgerow", Namespace: namespace, IsInstall: true}, nil)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	files, err := engine.Render(chrt, top)
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", chartDir, err)
	}
	return files, nil
}

// isEmptyYAML reports whether doc holds only comments and blank lines.
func isEmptyYAML(doc string) bool {
	for _, line := range strings.Split(doc, "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

// helmLabels are the labels Helm's conventions add that deploy/k8s has no
// use for; the comparison leaves them out.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance"}

// normalized is obj as generic JSON for comparison: without Helm's own
// labels, and with a ConfigMap's YAML files parsed, so comments and layout
// do not count.
func normalized(t *testing.T, obj any) map[string]any {
	t.Helper()
	j, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(j, &m); err != nil {
		t.Fatal(err)
	}
	if md, ok := m["metadata"].(map[string]any); ok {
		if labels, ok := md["labels"].(map[string]any); ok {
			for _, l := range helmLabels {
				delete(labels, l)
			}
		}
	}
	if data, ok := m["data"].(map[string]any); ok {
		for k, v := range data {
			if strings.HasSuffix(k, ".yaml") {
				var parsed any
				if err := yaml.Unmarshal([]byte(v.(string)), &parsed); err != nil {
					t.Fatalf("%s: %v", k, err)
				}
				data[k] = parsed
			}
		}
	}
	return m
}

// diffPaths lists where a and b differ, as JSON paths with both values.
func diffPaths(path string, a, b any) []string {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			break
		}
		keys := map[string]bool{}
		for k := range av {
			keys[k] = true
		}
		for k := range bv {
			keys[k] = true
		}
		var out []string
		for _, k := range slices.Sorted(func(yield func(string) bool) {
			for k := range keys {
				if !yield(k) {
					return
				}
			}
		}) {
			out = append(out, diffPaths(path+"."+k, av[k], bv[k])...)
		}
		return out
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			break
		}
		var out []string
		for i := range av {
			out = append(out, diffPaths(fmt.Sprintf("%s[%d]", path, i), av[i], bv[i])...)
		}
		return out
	}
	if reflect.DeepEqual(a, b) {
		return nil
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return []string{fmt.Sprintf("%s: chart %s, kustomize %s", path, ja, jb)}
}

// chartTopologies pairs each overlay with the chart's values file of its
// topology, and lists the overlay's objects the chart leaves to others:
// the namespace (helm install -n NS --create-namespace), the NATS cluster
// and Redis, which the chart takes as existing ones, and the local
// overlay's fake routes (fakellm.yaml, with the policy letting workers
// reach them).
var chartTopologies = []struct {
	overlay, values, namespace string
	kustomizeOnly              []string
}{
	{"k8s/overlays/production", "helm/values-production.yaml", "hedgerow", []string{
		"ConfigMap/hedgerow-nats", "Namespace/hedgerow",
		"NetworkPolicy/hedgerow-nats", "NetworkPolicy/hedgerow-redis",
		"PodDisruptionBudget/hedgerow-nats",
		"Service/hedgerow-nats", "Service/hedgerow-nats-headless", "Service/hedgerow-redis",
		"ServiceAccount/hedgerow-nats", "ServiceAccount/hedgerow-redis",
		"StatefulSet/hedgerow-nats", "StatefulSet/hedgerow-redis",
	}},
	{"k8s/overlays/local", "helm/values-local.yaml", "hedgerow-local", []string{
		"ConfigMap/hedgerow-nats", "Deployment/hedgerow-fakellm", "Namespace/hedgerow-local",
		"NetworkPolicy/hedgerow-fakellm", "NetworkPolicy/hedgerow-nats", "NetworkPolicy/hedgerow-redis",
		"NetworkPolicy/hedgerow-worker-fakellm",
		"PodDisruptionBudget/hedgerow-nats",
		"Service/hedgerow-fakellm", "Service/hedgerow-nats", "Service/hedgerow-nats-headless", "Service/hedgerow-redis",
		"ServiceAccount/hedgerow-nats", "ServiceAccount/hedgerow-redis",
		"StatefulSet/hedgerow-nats", "StatefulSet/hedgerow-redis",
	}},
}

// TestTheChartRendersEachOverlaysGatewaysAndWorkers renders the chart
// with each overlay's values file and compares it with the overlay object
// by object: every object the chart renders is the overlay's, field for
// field (but Helm's own labels and the configuration file's layout), and
// the overlay holds nothing more than what the chart leaves to others.
func TestTheChartRendersEachOverlaysGatewaysAndWorkers(t *testing.T) {
	for _, tp := range chartTopologies {
		t.Run(tp.overlay, func(t *testing.T) {
			chart := renderChart(t, tp.values, tp.namespace, nil)
			kust := render(t, tp.overlay)
			for kind, byName := range chart.objects {
				for name, obj := range byName {
					other, ok := kust.objects[kind][name]
					if !ok {
						t.Errorf("the chart renders %s %s, which the overlay has not", kind, name)
						continue
					}
					if d := diffPaths(kind+"/"+name, normalized(t, obj), normalized(t, other)); len(d) > 0 {
						t.Errorf("%s %s differs:\n  %s", kind, name, strings.Join(d, "\n  "))
					}
				}
			}
			var only []string
			for kind, byName := range kust.objects {
				for name := range byName {
					if _, ok := chart.objects[kind][name]; !ok {
						only = append(only, kind+"/"+name)
					}
				}
			}
			sort.Strings(only)
			if !slices.Equal(only, tp.kustomizeOnly) {
				t.Errorf("objects of the overlay only: %q, want %q", only, tp.kustomizeOnly)
			}
		})
	}
}

// The checks of the overlays hold for the chart too.
func TestTheChartKeepsTheOverlaysRules(t *testing.T) {
	for _, tp := range chartTopologies {
		t.Run(tp.values, func(t *testing.T) {
			chart := renderChart(t, tp.values, tp.namespace, nil)
			checkGoMemLimits(t, chart.objects)
			checkAutoscaling(t, chart.objects)
			checkEgress(t, chart.objects)
		})
	}
}

// The chart refuses, with the reason, values that would deploy a broken
// release.
func TestTheChartRefusesUnsoundValues(t *testing.T) {
	for _, tc := range []struct {
		name  string
		file  string
		extra map[string]any
		want  string
	}{
		{"no configuration", "", nil, "config: the hedgerow configuration is required"},
		{"a grace shorter than a policy's deadline", productionValues,
			map[string]any{"gateway": map[string]any{"terminationGracePeriodSeconds": 20}}, "terminationGracePeriodSeconds 20 is below policy default's deadline 30s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := renderChartFiles(tc.file, "hedgerow", tc.extra)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// The Prometheus Operator's objects, as far as the chart renders them:
// decoding is strict, so a field the chart adds must be added here.
type (
	serviceMonitor struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   metav1.ObjectMeta `json:"metadata"`
		Spec       struct {
			NamespaceSelector namespaceSelector    `json:"namespaceSelector"`
			Selector          metav1.LabelSelector `json:"selector"`
			Endpoints         []metricsEndpoint    `json:"endpoints"`
		} `json:"spec"`
	}
	podMonitor struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   metav1.ObjectMeta `json:"metadata"`
		Spec       struct {
			NamespaceSelector   namespaceSelector    `json:"namespaceSelector"`
			Selector            metav1.LabelSelector `json:"selector"`
			PodMetricsEndpoints []metricsEndpoint    `json:"podMetricsEndpoints"`
		} `json:"spec"`
	}
	namespaceSelector struct {
		MatchNames []string `json:"matchNames"`
	}
	metricsEndpoint struct {
		Port     string `json:"port"`
		Path     string `json:"path"`
		Interval string `json:"interval"`
	}
	prometheusRule struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   metav1.ObjectMeta `json:"metadata"`
		Spec       alertRules        `json:"spec"`
	}
	// alertRules are Prometheus' rule files' groups: deploy/prometheus/alerts.yaml's
	// whole, a PrometheusRule's spec.
	alertRules struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for,omitempty"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
)

// chartAlerts is the chart's copy of the alert rules, which its
// PrometheusRule reads (.Files.Get).
const chartAlerts = chartDir + "/files/alerts.yaml"

// The chart's copy of the alert rules is deploy/prometheus/alerts.yaml,
// byte for byte: the PrometheusRule cannot drift from the rules
// promtool's tests prove (a chart reads no file outside itself).
func TestTheChartsAlertRulesAreDeploysPrometheusAlerts(t *testing.T) {
	chart, err := os.ReadFile(chartAlerts)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile("prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(chart, rules) {
		t.Fatalf("%s differs from prometheus/alerts.yaml: cp deploy/prometheus/alerts.yaml deploy/%s", chartAlerts, chartAlerts)
	}
}

// monitoringValues turn on every monitoring object, with the labels a
// kube-prometheus-stack release selects.
var monitoringValues = map[string]any{"metrics": map[string]any{
	"serviceMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "kps"}},
	"prometheusRule": map[string]any{"enabled": true, "labels": map[string]any{"release": "kps"}},
}}

// The monitoring objects are off by default: their CRDs may not exist.
func TestTheChartRendersNoMonitoringObjectUnlessAsked(t *testing.T) {
	chart := renderChart(t, productionValues, "hedgerow", nil)
	for _, kind := range []string{"ServiceMonitor", "PodMonitor", "PrometheusRule"} {
		if n := len(chart.objects[kind]); n != 0 {
			t.Errorf("%d %s rendered by default; want none", n, kind)
		}
	}
}

// Asked for, the ServiceMonitor scrapes /metrics of the gateways' internal
// Service — the one Service its selector and port name match, whose
// target is the gateways' port of http.internal_listen —, the PodMonitor
// /metrics of the workers' Pods on their --metrics-listen port and no
// other Pods, both in the release's namespace with the labels asked for;
// the PrometheusRule's groups are alerts.yaml's, rule for rule.
func TestTheChartsMonitoringScrapesTheMetricsPortsAndCarriesTheAlertRules(t *testing.T) {
	const ns = "hedgerow"
	chart := renderChart(t, productionValues, ns, monitoringValues)
	sm := chart.get(t, "ServiceMonitor", "hedgerow-gateway").(*serviceMonitor)
	pm := chart.get(t, "PodMonitor", "hedgerow-worker").(*podMonitor)
	pr := chart.get(t, "PrometheusRule", "hedgerow").(*prometheusRule)
	for _, md := range []metav1.ObjectMeta{sm.Metadata, pm.Metadata, pr.Metadata} {
		if md.Labels["release"] != "kps" || md.Labels["app.kubernetes.io/part-of"] != "hedgerow" {
			t.Errorf("%s's labels %v lack the values' release: kps or the chart's own", md.Name, md.Labels)
		}
	}
	for name, sel := range map[string]namespaceSelector{"ServiceMonitor": sm.Spec.NamespaceSelector, "PodMonitor": pm.Spec.NamespaceSelector} {
		if !slices.Equal(sel.MatchNames, []string{ns}) {
			t.Errorf("the %s looks in namespaces %q, want the release's", name, sel.MatchNames)
		}
	}

	// The ServiceMonitor: each endpoint's port name picks exactly the
	// internal Service among those its selector matches.
	smSel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Fatalf("ServiceMonitor endpoints %+v, want one of /metrics", sm.Spec.Endpoints)
	}
	ep := sm.Spec.Endpoints[0]
	var scraped []string
	var target corev1.ServicePort
	for name, o := range chart.objects["Service"] {
		svc := o.(*corev1.Service)
		if !smSel.Matches(labels.Set(svc.Labels)) {
			continue
		}
		for _, p := range svc.Spec.Ports {
			if p.Name == ep.Port {
				scraped, target = append(scraped, name), p
			}
		}
	}
	if !slices.Equal(scraped, []string{"hedgerow-gateway-internal"}) {
		t.Fatalf("the ServiceMonitor scrapes the Services %q, want hedgerow-gateway-internal alone", scraped)
	}
	gw := chart.get(t, "Deployment", "hedgerow-gateway").(*appsv1.Deployment)
	svc := chart.get(t, "Service", "hedgerow-gateway-internal").(*corev1.Service)
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(gw.Spec.Template.Labels)) {
		t.Fatalf("the internal Service's selector %v misses the gateways' Pods %v", svc.Spec.Selector, gw.Spec.Template.Labels)
	}
	checkContainerPort(t, gw.Spec.Template.Spec.Containers[0], target.TargetPort.StrVal, chartInternalListen(t, chart))

	// The PodMonitor: the workers' Pods and no others, on the port of
	// their --metrics-listen.
	pmSel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	var pods []string
	for name, o := range chart.objects["Deployment"] {
		if pmSel.Matches(labels.Set(o.(*appsv1.Deployment).Spec.Template.Labels)) {
			pods = append(pods, name)
		}
	}
	if !slices.Equal(pods, []string{"hedgerow-worker"}) {
		t.Fatalf("the PodMonitor scrapes the Pods of %q, want hedgerow-worker's alone", pods)
	}
	if len(pm.Spec.PodMetricsEndpoints) != 1 || pm.Spec.PodMetricsEndpoints[0].Path != "/metrics" {
		t.Fatalf("PodMonitor endpoints %+v, want one of /metrics", pm.Spec.PodMetricsEndpoints)
	}
	wk := chart.get(t, "Deployment", "hedgerow-worker").(*appsv1.Deployment).Spec.Template.Spec.Containers[0]
	checkContainerPort(t, wk, pm.Spec.PodMetricsEndpoints[0].Port, flagValue(t, wk.Args, "--metrics-listen"))

	// The rules: alerts.yaml's, decoded the same strict way.
	data, err := os.ReadFile("prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	var want alertRules
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&want); err != nil {
		t.Fatalf("prometheus/alerts.yaml: %v", err)
	}
	if len(want.Groups) == 0 || !reflect.DeepEqual(pr.Spec, want) {
		t.Fatalf("the PrometheusRule's groups differ from prometheus/alerts.yaml's:\n  %s", strings.Join(diffPaths("spec", normalized(t, pr.Spec), normalized(t, want)), "\n  "))
	}
}

// checkContainerPort checks that c has a port named name whose number is
// listen's, the address its process serves /metrics on.
func checkContainerPort(t *testing.T, c corev1.Container, name, listen string) {
	t.Helper()
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		t.Fatalf("%s: %v", c.Name, err)
	}
	for _, p := range c.Ports {
		if p.Name == name {
			if strconv.Itoa(int(p.ContainerPort)) != port {
				t.Fatalf("%s's port %s is %d, but /metrics is served on %s", c.Name, name, p.ContainerPort, listen)
			}
			return
		}
	}
	t.Fatalf("%s has no port named %s (ports %+v)", c.Name, name, c.Ports)
}

// chartInternalListen is http.internal_listen of the hedgerow
// configuration the chart's ConfigMap carries: where gateways serve
// /metrics.
func chartInternalListen(t *testing.T, chart rendered) string {
	t.Helper()
	cm := chart.get(t, "ConfigMap", "hedgerow-config").(*corev1.ConfigMap)
	var cfg struct {
		HTTP struct {
			InternalListen string `json:"internal_listen"`
		} `json:"http"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["hedgerow.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg.HTTP.InternalListen
}
